"""Data, in one package: what a ``data`` argument is and the batches it becomes.

* ``interp.data.batch``: ``Batch`` (inputs, attention mask, labels), ``CheckedBatch`` (a batch that passed the
  input checks: ``check_batch``) and image preprocessing;
* ``interp.data.sources``: the researcher's own data (folders of images, text and table files,
  numpy arrays, ``datasets``) as a streamed, sharded ``DataSource`` (``resolve_data``), and
  ``data_kind``, which tells a built-in name, a path and a sentence apart;
* ``interp.data.builtin``: the built-in data sets (``photos``, ``digits``, ``mnist``,
  ``python-docs``) and MNIST's fetch entry (``DATASETS``);
* ``interp.data.iterate``: ``open_data``, the one function that decides what a ``data`` argument
  is (the API, the pipeline and the CLI call it), and ``iter_batches``.
"""

from interp.data.batch import IMAGENET_MEAN, IMAGENET_STD, Batch, CheckedBatch, check_batch
from interp.data.builtin import (
    BUILTIN, DATASETS, builtin_batches, builtin_options, digits, mnist, photos, python_docs, python_docs_text,
)
from interp.data.iterate import batch_to_device, check_data_name, iter_batches, model_inputs, open_data, to_device
from interp.data.sources import DataSource, data_kind, resolve_data

__all__ = ["BUILTIN", "DATASETS", "IMAGENET_MEAN", "IMAGENET_STD", "Batch", "CheckedBatch", "DataSource",
           "batch_to_device", "builtin_batches", "builtin_options", "check_batch", "check_data_name", "data_kind",
           "digits", "iter_batches", "mnist", "model_inputs", "open_data", "photos", "python_docs", "python_docs_text",
           "resolve_data", "to_device"]
