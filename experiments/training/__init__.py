"""Training recipes, kept apart from the loaders (``interp.models`` imports nothing from here).

* ``experiments.training.corpus``: the offline text corpus (the running interpreter's standard library);
* ``experiments.training.sinks``: the sink experiment, one resumable run of an arm (tiny LLaMA or the
  MNIST ViT) with its recipe, data order and checkpoints;
* ``experiments.training.sink_metrics``: measuring an arm, with ``interp.analysis.sinks`` where the bridge
  can run it and directly from the attention weights where it cannot (slots, registers);
* ``experiments.training.sink_results``: every run, the CSVs and the summary; ``sink_report``: the
  Table-4-style tables, the figures and the model card;
* ``experiments.training.backcopy``: the positive control, Guo et al.'s Bigram-Backcopy task, where
  sinks form (``backcopy_results``: the CSVs; ``backcopy_report``: findings 4d's tables and figure).
"""
