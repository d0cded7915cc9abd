"""Experiments that use interp: training recipes, sink arms, science scripts. Not installed with the
library; run from the checkout root (``python -m experiments.<module>``)."""
