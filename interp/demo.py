"""``interp demo``: the main job. Until the analyzers land it runs the bias inventory only."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from interp.io import write_table


def run_demo(model: Optional[str], data: Optional[str], out: Path, quick: bool = False) -> None:
    import interp
    from interp.models.zoo import ZOO

    name = model or "dinov2-s14"
    if model is None and not ZOO[name].available():
        print(f"notice: {name} weights are not cached (run `make models`); using digits-vit")
        name = "digits-vit"
    print(f"interp demo on {name}: bias inventory (recording and analyses are not built yet)")
    m = interp.load_model(name)
    spec = interp.bias_spec(m)
    write_table(spec, out / "bias_spec")
    print(spec.groupby("kind")[["present", "norm"]].agg({"present": "all", "norm": "mean"}))
    print(f"wrote {out}/bias_spec.csv")
