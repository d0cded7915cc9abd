"""Training recipes, kept apart from the loaders (``interp.models`` imports nothing from here).

``interp.training.corpus``: the offline text corpus (the running interpreter's standard library);
``interp.training.sinks``: the sink experiment of issue 27 (tiny LLaMA and MNIST ViT arms, resumable
runs, measurements with ``interp.analysis.sinks``).
"""
