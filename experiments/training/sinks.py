"""The sink experiment: does an explicit bias or a key/value slot replace the attention sink?

Every arm (``experiments.training.sink_arms``) of a domain trains with one recipe: the same optimiser,
schedule, token or image budget, and, for a seed, the same initial weights for what the arms
share and the same data in the same order. Every ``every`` steps (and at step 0) the run is
measured on held-out data (``experiments.training.sink_metrics.measure``) and checkpointed atomically
(model, optimiser, schedule, measurements so far); a killed run resumes from its last checkpoint
and ends bit for bit where an uninterrupted one does. A checkpoint or results table of another
recipe is refused (``StaleResultsError``), never mixed; a checkpoint is keyed by recipe, domain, arm
and seed (all stored in it and checked on load) and one that cannot be read (truncated, empty, not a
checkpoint) or does not fit the arm's model is a ``CheckpointError``.

Text: windows of ``context`` bytes of the standard-library corpus (``experiments.training.corpus``)
at offsets drawn uniformly from the training split by a generator seeded with the seed; loss =
mean cross-entropy (nats per byte) of bytes 2..context given the bytes before them, the same
predictions in every arm (a sink token's own prediction is not scored). AdamW (betas 0.9 / 0.95,
weight decay on matrices only: not norms, biases, slots), learning rate lr * f(s) with linear
warm-up f(s) = (s + 1) / warmup, then cosine to ``final_lr_ratio`` (``schedule="cosine"``, the
first release's recipe) or constant 1 (``schedule="constant"``: Gu et al. 2024 find that annealing
the rate shrinks the sink); gradient norm clipped at 1. Validation: ``val_windows`` windows spread
evenly over the validation files. ``sampling="disjoint"`` cuts the training split into
consecutive non-overlapping windows and draws ``steps x batch`` of them without replacement (the
seed's permutation): no training byte is read twice, and a split too small for that is refused;
``corpus="packages"`` reads the installed packages' sources (``experiments.training.corpus``), which are
large enough for that.

Vision: the MNIST ViT recipe (``experiments.training.mnist_vit``: AdamW lr 2e-3 one-cycle, weight decay
0.05 on every parameter, the seed's permutation of the 60,000 training images) cut to ``steps``
steps of ``batch`` images (32 rather than the recipe's 128: more updates for the same compute);
accuracy on the first ``n_test`` test images.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from interp.data import mnist
from interp.errors import CheckpointError, InputError, StaleResultsError
from interp.io import atomic_path
from interp.models.loading import check_device
from experiments.training.sink_arms import (
    MNIST_IMAGE, SINK_ID, TEXT_ARMS, VISION_ARMS, LMShape, build_lm_arm, build_vit_arm, n_prefix,
)
from experiments.training.corpus import DEFAULT_BUDGET, Corpus, packages_corpus, stdlib_corpus
from experiments.training.sink_metrics import measure

RECIPE_VERSION = 1


@dataclass(frozen=True)
class TextRecipe:
    shape: LMShape = field(default_factory=LMShape)
    steps: int = 300
    batch: int = 16
    lr: float = 3e-3
    warmup: int = 30
    final_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    every: int = 75
    val_windows: int = 128
    probe_windows: int = 32
    corpus_budget: int = DEFAULT_BUDGET
    schedule: str = "cosine"    # | "constant" after warm-up
    sampling: str = "uniform"   # | "disjoint": non-overlapping windows, none read twice
    corpus: str = "stdlib"      # | "packages"

    def __post_init__(self) -> None:
        for name, allowed in (("schedule", SCHEDULES), ("sampling", SAMPLINGS), ("corpus", CORPORA)):
            if getattr(self, name) not in allowed:
                raise InputError(f"TextRecipe {name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")


SCHEDULES, SAMPLINGS, CORPORA = ("cosine", "constant"), ("uniform", "disjoint"), ("stdlib", "packages")
# fields added after the first release: at these values a recipe keeps its first-release fingerprint
_LEGACY = dict(schedule="cosine", sampling="uniform", corpus="stdlib")


def fresh_text_recipe(**changes: Any) -> TextRecipe:
    """The rerun's text recipe: constant rate after warm-up, the packages' sources, no window read twice,
    512 validation windows (the first release's other settings unless ``changes`` says otherwise)."""
    base = dict(schedule="constant", sampling="disjoint", corpus="packages", val_windows=512, warmup=50)
    return TextRecipe(**{**base, **changes})


def text_corpus(recipe: TextRecipe, cache: Optional[Path] = None) -> Corpus:
    """The corpus ``recipe.corpus`` names, of ``recipe.corpus_budget`` bytes."""
    if recipe.corpus == "packages":
        return packages_corpus(recipe.corpus_budget, cache=cache)
    return stdlib_corpus(recipe.corpus_budget, cache=cache)


@dataclass(frozen=True)
class VisionRecipe:
    steps: int = 400
    batch: int = 32
    lr: float = 2e-3
    weight_decay: float = 0.05
    every: int = 100
    n_test: int = 2000
    probe_images: int = 256


def recipe_fingerprint(recipe: Union[TextRecipe, VisionRecipe], corpus_sha256: str = "") -> str:
    """sha256 (16 hex) of one domain's recipe, its data (the corpus, for text) and ``RECIPE_VERSION``:
    what a run of that domain is bound to."""
    fields = {k: v for k, v in asdict(recipe).items() if k not in _LEGACY or v != _LEGACY[k]}
    ident = json.dumps(dict(kind=type(recipe).__name__, recipe=fields, corpus=corpus_sha256,
                            version=RECIPE_VERSION), sort_keys=True)
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


# ----- text ---------------------------------------------------------------------------------------------


def train_offsets(n_tokens: int, recipe: TextRecipe, seed: int) -> Tensor:
    """[steps, batch] window starts, the seed's data order: uniform over the training split, or
    (``sampling="disjoint"``) distinct starts of the consecutive non-overlapping windows, drawn
    without replacement."""
    gen = torch.Generator().manual_seed(seed)
    context, need = recipe.shape.context, recipe.steps * recipe.batch
    if recipe.sampling == "uniform":
        return torch.randint(0, n_tokens - context, (recipe.steps, recipe.batch), generator=gen)
    available = n_tokens // context
    if available < need:
        raise InputError(f"{recipe.steps} steps x {recipe.batch} windows of {context} bytes need {need * context} "
                         f"training bytes read once; the split has {n_tokens} ({available} windows): raise "
                         "corpus_budget or train fewer steps")
    return (torch.randperm(available, generator=gen)[:need] * context).view(recipe.steps, recipe.batch)


def windows(tokens: Tensor, starts: Tensor, context: int) -> Tensor:
    """Long [len(starts), context]: the byte windows starting at ``starts``."""
    return tokens[starts[:, None] + torch.arange(context)].long()


def val_windows(tokens: Tensor, n: int, context: int) -> Tensor:
    """``n`` windows spread evenly over the validation split (the same for every arm and seed)."""
    return windows(tokens, torch.linspace(0, len(tokens) - context - 1, n).long(), context)


def with_sink(batch: Tensor, arm: str) -> Tensor:
    """The model's input: the sink token prepended in arm ``sink_token``, else the bytes."""
    return torch.cat([torch.full((len(batch), 1), SINK_ID, device=batch.device), batch], 1) \
        if arm == "sink_token" else batch


def lm_loss(model: nn.Module, batch: Tensor, arm: str) -> Tensor:
    """Mean cross-entropy (nats per byte) of bytes 2..n given the bytes before them (module doc)."""
    logits = model(input_ids=with_sink(batch, arm)).logits[:, n_prefix("text", arm):-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


@torch.no_grad()
def lm_val_loss(model: nn.Module, val: Tensor, arm: str, batch: int = 32) -> float:
    model.eval()
    losses = [float(lm_loss(model, val[i:i + batch], arm)) * len(val[i:i + batch]) for i in range(0, len(val), batch)]
    return sum(losses) / len(val)


def _text_schedule(recipe: TextRecipe):
    def factor(step: int) -> float:
        if step < recipe.warmup:
            return (step + 1) / recipe.warmup
        if recipe.schedule == "constant":
            return 1.0
        progress = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
        return recipe.final_lr_ratio + (1 - recipe.final_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def lm_adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW (betas 0.9 / 0.95) for the tiny LLaMA arms: weight decay on matrices only (not norms, biases,
    slots)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decayed = [p.ndim >= 2 and "slot_" not in n for n, p in named]
    return torch.optim.AdamW([dict(params=[p for (_, p), d in zip(named, decayed) if d], weight_decay=weight_decay),
                              dict(params=[p for (_, p), d in zip(named, decayed) if not d], weight_decay=0.0)],
                             lr=lr, betas=(0.9, 0.95))


def training_device(name: Union[str, torch.device]) -> torch.device:
    """``name`` as a device the sink runs can train on: ``interp.models.loading.check_device``'s checks
    (a torch device, CUDA present, index in range), then the CPU or CUDA only; else one ``InputError``."""
    device = torch.device(check_device(name))
    if device.type not in ("cpu", "cuda"):
        raise InputError(f"device {name!r}: the sink runs are tested on cpu and cuda only; pass one of them")
    return device


class TextTask:
    """One text arm and seed: model, optimiser, batches, loss and measurement (module doc).

    ``device``: where the model trains and the validation loss is computed ("cpu", "cuda", ...). The
    initial weights and the data order do not depend on it (built on the CPU, then moved); the sink
    measurements run on a CPU copy of the model, so they take the same code path whichever device
    trains. A run may resume on another device (checkpoints are read onto the CPU)."""

    domain = "text"

    def __init__(self, arm: str, seed: int, recipe: TextRecipe, corpus: Corpus,
                 device: Union[str, torch.device] = "cpu") -> None:
        if arm not in TEXT_ARMS:
            raise InputError(f"the text arms are {', '.join(TEXT_ARMS)}; got {arm!r}")
        self.arm, self.seed, self.recipe, self.corpus = arm, seed, recipe, corpus
        self.device = training_device(device)
        self.offsets = train_offsets(len(corpus.train), recipe, seed)
        self.val = val_windows(corpus.val, recipe.val_windows, recipe.shape.context).to(self.device)

    def build(self) -> nn.Module:
        return build_lm_arm(self.arm, self.seed, self.recipe.shape).to(self.device)

    def optimiser(self, model: nn.Module) -> tuple[torch.optim.Optimizer, Any]:
        opt = lm_adamw(model, self.recipe.lr, self.recipe.weight_decay)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, _text_schedule(self.recipe))

    def batch(self, step: int) -> Tensor:
        return windows(self.corpus.train, self.offsets[step], self.recipe.shape.context).to(self.device)

    def loss(self, model: nn.Module, batch: Tensor) -> Tensor:
        return lm_loss(model, batch, self.arm)

    def measure(self, model: nn.Module, step: int) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
        probe = with_sink(self.val[: self.recipe.probe_windows].cpu(), self.arm)
        on_cpu = model
        if self.device.type != "cpu":  # a fresh CPU model given the weights: no second copy on the device
            on_cpu = build_lm_arm(self.arm, self.seed, self.recipe.shape)
            on_cpu.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
        heads, layers, summary = measure(on_cpu, probe, "text", self.arm)
        r = self.recipe
        row = dict(tokens=step * r.batch * r.shape.context, val_loss=lm_val_loss(model, self.val, self.arm),
                   accuracy=float("nan"), **summary)
        return row, heads, layers


# ----- vision -------------------------------------------------------------------------------------------


class VisionTask:
    """One vision arm and seed of the MNIST ViT recipe, cut to ``recipe.steps`` steps."""

    domain = "vision"
    device = torch.device("cpu")  # trains on the CPU (run_arm records it)
    _data: dict = {}  # MNIST, loaded once per process

    def __init__(self, arm: str, seed: int, recipe: VisionRecipe) -> None:
        if arm not in VISION_ARMS:
            raise InputError(f"the vision arms are {', '.join(VISION_ARMS)}; got {arm!r}")
        self.arm, self.seed, self.recipe = arm, seed, recipe
        if not VisionTask._data:
            VisionTask._data.update(train=mnist(MNIST_IMAGE, "train"), test=mnist(MNIST_IMAGE, "test"))
        self.x, self.y = VisionTask._data["train"]
        self.x_test, self.y_test = (t[: recipe.n_test] for t in VisionTask._data["test"])
        if recipe.steps * recipe.batch > len(self.x):
            raise InputError(f"{recipe.steps} steps of {recipe.batch} images exceed one epoch of MNIST "
                             f"({len(self.x)}): fewer steps or a smaller batch")
        self.order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(seed))

    def build(self) -> nn.Module:
        return build_vit_arm(self.arm, self.seed)

    def optimiser(self, model: nn.Module) -> tuple[torch.optim.Optimizer, Any]:
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=self.recipe.lr, weight_decay=self.recipe.weight_decay)
        return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.recipe.lr, total_steps=self.recipe.steps)

    def batch(self, step: int) -> tuple[Tensor, Tensor]:
        idx = self.order[step * self.recipe.batch:(step + 1) * self.recipe.batch]
        return self.x[idx], self.y[idx]

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        return F.cross_entropy(model(pixel_values=batch[0]).logits, batch[1])

    @torch.no_grad()
    def accuracy(self, model: nn.Module, batch: int = 500) -> float:
        model.eval()
        hits = sum(int((model(pixel_values=self.x_test[i:i + batch]).logits.argmax(-1)
                        == self.y_test[i:i + batch]).sum()) for i in range(0, len(self.x_test), batch))
        return hits / len(self.x_test)

    def measure(self, model: nn.Module, step: int) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
        heads, layers, summary = measure(model, self.x_test[: self.recipe.probe_images], "vision", self.arm)
        row = dict(images=step * self.recipe.batch, val_loss=float("nan"), accuracy=self.accuracy(model), **summary)
        return row, heads, layers


Task = Union[TextTask, VisionTask]


# ----- one resumable run --------------------------------------------------------------------------------


def checkpoint_path(work: Path, task: Task) -> Path:
    return Path(work) / f"{task.domain}-{task.arm}-seed{task.seed}.pt"


KEYS = ("domain", "arm", "seed")  # with the recipe: what a checkpoint is keyed by


def read_checkpoint(path: Path) -> dict:
    """A checkpoint's state, read with ``weights_only``; a file that is not a whole checkpoint
    (truncated, empty, another kind of file, a state without its keys) is a ``CheckpointError``."""
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError, ... for a bad file
        raise CheckpointError(f"{path} is not a readable checkpoint ({type(err).__name__}: {str(err)[:120]}): "
                              "it is truncated, empty or another kind of file; delete it to train that run "
                              "afresh") from err
    missing = [k for k in ("recipe", "step", "final_step", "model", *KEYS) if not isinstance(state, dict)
               or k not in state]
    if missing:
        raise CheckpointError(f"{path} lacks {', '.join(missing)}: not a checkpoint of this library's sink runs "
                              "(or one written before checkpoints were keyed by arm); delete it to train afresh")
    return state


def _load_checkpoint(path: Path, fingerprint: str, task: Optional["Task"] = None) -> Optional[dict]:
    if not path.exists():
        return None
    state = read_checkpoint(path)
    if state.get("recipe") != fingerprint:
        raise StaleResultsError(f"{path} is a checkpoint of recipe {state.get('recipe')}, not of this run's "
                                f"{fingerprint}: pass another work folder, or --overwrite to start afresh")
    if task is not None:
        found, wanted = {k: state[k] for k in KEYS}, {k: getattr(task, k) for k in KEYS}
        if found != wanted:
            raise CheckpointError(f"{path} is the checkpoint of {found}, not of this run's {wanted} (a renamed or "
                                  "copied file): delete it, or put it back under its own name")
    return state


def _tag(task: Task, step: int, fingerprint: str, rows: list[dict]) -> list[dict]:
    return [dict(domain=task.domain, arm=task.arm, seed=task.seed, step=step, **row, recipe=fingerprint)
            for row in rows]


def _record(task: Task, model: nn.Module, step: int, fingerprint: str, state: dict, seconds: float) -> None:
    row, heads, layers = task.measure(model, step)
    row = dict(row, train_seconds=round(seconds, 2), device=str(task.device))  # seconds compare on one device only
    state["runs"] += _tag(task, step, fingerprint, [row])
    state["heads"] += _tag(task, step, fingerprint, heads.to_dict("records"))
    state["layers"] += _tag(task, step, fingerprint, layers.to_dict("records"))


def _save(path: Path, state: dict, model: nn.Module, opt: Any, sched: Any, step: int, seconds: float) -> None:
    state.update(step=step, seconds=seconds, model=model.state_dict(), optimizer=opt.state_dict(),
                 scheduler=sched.state_dict())
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def run_arm(task: Task, work: Path, fingerprint: str, stop_after: Optional[int] = None) -> tuple[nn.Module, dict]:
    """Train ``task`` from its last checkpoint in ``work`` (or from scratch) to the recipe's last step,
    measuring and checkpointing every ``every`` steps. Returns (model, state: ``runs``, ``heads``,
    ``layers`` row lists, ``seconds`` of training). ``stop_after``: return after that many steps
    (tests)."""
    recipe, path = task.recipe, checkpoint_path(work, task)
    model = task.build()
    opt, sched = task.optimiser(model)
    state = _load_checkpoint(path, fingerprint, task)
    if state is None:
        state = dict(recipe=fingerprint, final_step=recipe.steps, runs=[], heads=[], layers=[],
                     **{k: getattr(task, k) for k in KEYS})
        _record(task, model, 0, fingerprint, state, 0.0)
        _save(path, state, model, opt, sched, 0, 0.0)
    else:
        try:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise CheckpointError(f"{path} does not fit the {task.domain} arm {task.arm!r}'s model or optimiser "
                                  f"({str(err)[:160]}): delete it to train that run afresh") from err
    step, seconds, done = state["step"], state["seconds"], 0
    while step < recipe.steps and (stop_after is None or done < stop_after):
        start = time.perf_counter()
        model.train()
        loss = task.loss(model, task.batch(step))
        opt.zero_grad()
        loss.backward()
        if getattr(recipe, "clip", None):
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
        opt.step()
        sched.step()
        if task.device.type == "cuda":  # the step's kernels finish inside its time
            torch.cuda.synchronize()
        step, done, seconds = step + 1, done + 1, seconds + time.perf_counter() - start
        if step % recipe.every == 0 or step == recipe.steps:
            _record(task, model, step, fingerprint, state, seconds)
            _save(path, state, model, opt, sched, step, seconds)
    return model.eval(), state
