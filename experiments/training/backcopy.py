"""A positive control for the sink experiment: Guo et al. 2024's Bigram-Backcopy task, where
attention sinks do form in a 2-layer model within a few thousand steps.

The task (Guo et al. 2024, "Active-dormant attention heads", section 2; their ``bbm`` generator):
``n_tokens`` ordinary tokens with a fixed random bigram transition matrix P (rows drawn from a
Dirichlet(``alpha``) by a generator seeded with ``task_seed``: the same task for every arm and seed),
of which the ``n_triggers`` tokens most frequent under P's stationary distribution are *triggers*.
A sequence of ``context`` tokens x_0 .. x_{n-1}:

    x_0     uniform over the non-trigger tokens
    x_j     = x_{j-2}                 if x_{j-1} is a trigger     (a *copy* position: back-copy)
    x_j     ~ P[x_{j-1}, :]           otherwise                   (a *bigram* position)

By induction no two triggers are adjacent (x_0 is no trigger, and a copied token is the one before
a trigger), so the copy is always of an ordinary token. The model sees ``<s>`` (id ``n_tokens``)
before x_0 in the arms with a start token; every arm is scored on the same predictions, x_1 .. x_{n-1}
given the tokens before them (x_0's own prediction is never scored).

The arms (``ARMS``): ``none`` (the tiny LLaMA of ``experiments.training.sink_arms``, no bias, with ``<s>``),
``kv_slot`` and ``k_slot_v0`` (the same with a learnable key/value slot, or key slot with value 0, per
head: ``sink_arms.add_slots``), and ``none_no_start`` (no ``<s>``: x_0 is the first position). For a
seed every arm starts from the same weights for what they share and sees the same sequences.

Recipe: AdamW (betas 0.9 / 0.95; weight decay on matrices only, not norms or slots), learning rate
``lr`` after a linear warm-up of ``warmup`` steps, then constant; gradient norm clipped at 1. The
run loop, measurement and checkpoints are ``experiments.training.sinks.run_arm``'s, with a fingerprint
of (recipe, arm, seed): a checkpoint of another arm, seed or recipe is refused
(``CheckpointError``, a ``StaleResultsError``), and so is a truncated or empty one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
import transformers as tf
from torch import Tensor, nn

from interp.analysis.sinks import NEAR_BAND, SINK_THRESHOLD
from interp.errors import CheckpointError, InputError
from experiments.training.sink_arms import LMShape, add_slots, has_slot, set_slot_gate
from experiments.training.sink_metrics import direct_tables
from experiments.training.sinks import checkpoint_path, lm_adamw, read_checkpoint, run_arm

ARMS = ("none", "kv_slot", "k_slot_v0", "none_no_start")
SLOT_ARMS = ("kv_slot", "k_slot_v0")
RECIPE_VERSION = 1


@dataclass(frozen=True)
class BackcopyRecipe:
    shape: LMShape = field(default_factory=lambda: LMShape(n_layers=2, n_heads=4, d_model=64, d_ff=128, context=64))
    n_tokens: int = 64
    n_triggers: int = 3
    alpha: float = 0.5
    task_seed: int = 0
    steps: int = 3000
    batch: int = 32
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.1
    clip: float = 1.0
    every: int = 250
    eval_sequences: int = 256
    probe_sequences: int = 64


def recipe_fingerprint(recipe: BackcopyRecipe) -> str:
    """sha256 (16 hex) of the recipe (task included) and ``RECIPE_VERSION``, all but ``steps``: the
    learning rate is constant after warm-up, so a run's first s steps do not depend on the budget, and
    a finished run may be extended (its checkpoint resumes under a larger ``steps``)."""
    fields = {k: v for k, v in asdict(recipe).items() if k != "steps"}
    ident = json.dumps(dict(kind="BackcopyRecipe", recipe=fields, version=RECIPE_VERSION), sort_keys=True)
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def run_fingerprint(recipe: BackcopyRecipe, arm: str, seed: int) -> str:
    """sha256 (16 hex) of (recipe fingerprint, arm, seed): what one run and its checkpoint are bound to."""
    ident = json.dumps(dict(recipe=recipe_fingerprint(recipe), arm=arm, seed=int(seed)), sort_keys=True)
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def check_arm(arm: Any) -> str:
    if arm not in ARMS:
        raise InputError(f"the Bigram-Backcopy arms are {', '.join(ARMS)}; got {arm!r}")
    return arm


# ----- the task -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BackcopyTask:
    """The data-generating process of the module doc: P [n, n] (float64), the triggers, the start id."""

    transition: Tensor
    triggers: tuple[int, ...]

    @property
    def n_tokens(self) -> int:
        return self.transition.shape[0]

    @property
    def start_id(self) -> int:
        return self.n_tokens

    def is_trigger(self, tokens: Tensor) -> Tensor:
        return torch.isin(tokens, torch.tensor(self.triggers))


def stationary(transition: Tensor, iterations: int = 2000) -> Tensor:
    """The stationary distribution pi = pi P of a row-stochastic matrix (power iteration)."""
    pi = torch.full((transition.shape[0],), 1.0 / transition.shape[0], dtype=torch.float64)
    for _ in range(iterations):
        pi = pi @ transition
    return pi / pi.sum()


def make_task(recipe: BackcopyRecipe) -> BackcopyTask:
    """P with Dirichlet(alpha) rows from ``task_seed``; triggers = the ``n_triggers`` most frequent tokens."""
    if not 0 < recipe.n_triggers < recipe.n_tokens - 1:
        raise InputError(f"n_triggers must be between 1 and n_tokens - 2 ({recipe.n_tokens - 2}); "
                         f"got {recipe.n_triggers}")
    rng = np.random.default_rng(recipe.task_seed)
    draws = torch.from_numpy(rng.dirichlet(np.full(recipe.n_tokens, recipe.alpha), size=recipe.n_tokens))
    transition = draws / draws.sum(1, keepdim=True)  # rows sum to 1 in float64
    triggers = tuple(sorted(int(i) for i in stationary(transition).argsort(descending=True)[: recipe.n_triggers]))
    return BackcopyTask(transition, triggers)


def generate(task: BackcopyTask, n: int, length: int, gen: torch.Generator) -> Tensor:
    """Long [n, length]: n sequences of the module doc's process (no start token)."""
    ordinary = torch.ones(task.n_tokens, dtype=torch.float64)
    ordinary[list(task.triggers)] = 0
    seq = torch.empty(n, length, dtype=torch.long)
    seq[:, 0] = torch.multinomial(ordinary.expand(n, -1), 1, generator=gen)[:, 0]
    for j in range(1, length):
        bigram = torch.multinomial(task.transition[seq[:, j - 1]], 1, generator=gen)[:, 0]
        if j >= 2:
            seq[:, j] = torch.where(task.is_trigger(seq[:, j - 1]), seq[:, j - 2], bigram)
        else:
            seq[:, j] = bigram  # x_0 is never a trigger
    return seq


def copy_positions(task: BackcopyTask, seq: Tensor) -> Tensor:
    """Bool [n, length - 1]: whether target x_j (j = 1 ..) is a copy (x_{j-1} is a trigger)."""
    return task.is_trigger(seq[:, :-1])


def with_start(seq: Tensor, arm: str, start_id: int) -> Tensor:
    """The model's input: ``<s>`` prepended except in ``none_no_start``."""
    if arm == "none_no_start":
        return seq
    return torch.cat([torch.full((len(seq), 1), start_id, dtype=seq.dtype), seq], 1)


def n_start(arm: str) -> int:
    return 0 if arm == "none_no_start" else 1


def target_logits(model: nn.Module, seq: Tensor, arm: str, start_id: int) -> Tensor:
    """[n, length - 1, vocab]: the logits that predict x_1 .. x_{n-1} (the same predictions in every arm)."""
    p = n_start(arm)
    logits = model(input_ids=with_start(seq, arm, start_id)).logits
    return logits[:, p:p + seq.shape[1] - 1]


# ----- the model ----------------------------------------------------------------------------------------


def build_model(arm: str, seed: int, recipe: BackcopyRecipe) -> tf.LlamaForCausalLM:
    """The arm at the seed's shared initialisation: the tiny LLaMA (vocabulary: the tokens and ``<s>``),
    plus a slot per head in the slot arms (``sink_arms.add_slots``, drawn from a generator of the seed)."""
    check_arm(arm)
    shape = recipe.shape
    config = shape.config(bias=False)
    config.vocab_size = recipe.n_tokens + 1
    torch.manual_seed(seed)
    model = tf.LlamaForCausalLM(config)
    if arm in SLOT_ARMS:
        gen = torch.Generator().manual_seed(1_000_003 * (seed + 1))
        add_slots(model, shape.n_heads, shape.d_model // shape.n_heads, arm == "kv_slot", gen)
    return model


def _constant_after_warmup(warmup: int):
    return lambda step: min(1.0, (step + 1) / warmup)


# ----- evaluation ---------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(model: nn.Module, task: BackcopyTask, seq: Tensor, arm: str) -> dict:
    """Loss (nats per token) over all scored targets, on the copy and on the bigram positions, the
    copy and bigram accuracies (argmax), and the loss the true P gives on the bigram positions
    (the floor no model can beat there)."""
    model.eval()
    logits = target_logits(model, seq, arm, task.start_id).double()
    targets, copy = seq[:, 1:], copy_positions(task, seq)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none").view_as(targets)
    hits = (logits.argmax(-1) == targets).double()
    true_ce = -task.transition[seq[:, :-1], targets].log()
    return dict(loss=float(ce.mean()), copy_loss=float(ce[copy].mean()), bigram_loss=float(ce[~copy].mean()),
                copy_accuracy=float(hits[copy].mean()), bigram_accuracy=float(hits[~copy].mean()),
                bigram_floor=float(true_ce[~copy].mean()), copy_share=float(copy.double().mean()))


def head_masses(model: nn.Module, task: BackcopyTask, seq: Tensor, arm: str) -> pd.DataFrame:
    """Per layer and head: ``mass_start`` (on ``<s>``; in ``none_no_start`` on x_0, the first position;
    the first position's own query row left out, ``sink_metrics``), ``mass_slot``, their floors under
    uniform causal attention ``uniform_start`` / ``uniform_slot``, and the same masses split by query:
    on the trigger queries (``_active``: where a copy head has work) and the others (``_dormant``; for
    ``start`` without the first position's own row), with ``mass_prev_*`` on the token just before the
    query (on a trigger query: the token to copy); plus ``sink_metrics.direct_tables``' value and
    output columns."""
    probe = with_start(seq, arm, task.start_id)
    heads, _ = direct_tables(model, probe, "text", arm)
    heads = heads.rename(columns={"mass_first": "mass_start", "uniform_first": "uniform_start"}).drop(
        columns=["mass_first_text", "mass_registers", "uniform_first_text", "uniform_registers"])
    with torch.no_grad():
        attentions = model(input_ids=probe, output_attentions=True).attentions
    slot = int(has_slot(model))
    trigger = task.is_trigger(probe)  # [b, pos]; <s> is no trigger
    rows = []
    previous = (torch.arange(probe.shape[1]) - 1).clamp_min(0) + slot  # key column of the token before the query
    for layer, a in enumerate(attentions):
        a = a.double()  # [b, h, q, slot + k]
        prev = a.gather(-1, previous.expand(*a.shape[:2], -1)[..., None])[..., 0]
        for part, queries in (("active", trigger), ("dormant", ~trigger)):
            w = queries[:, None, :].double()
            denominator = w.sum((0, 2)).clamp_min(1)
            w_start = w.clone()
            w_start[..., 0] = 0  # the first position's own row (its mass there is 1 without a slot)
            start = (a[..., slot] * w_start).sum((0, 2)) / w_start.sum((0, 2)).clamp_min(1)
            on_slot = (a[..., 0] * w).sum((0, 2)) / denominator if slot else torch.full((a.shape[1],), np.nan)
            on_prev = (prev * w).sum((0, 2)) / denominator
            for h in range(a.shape[1]):
                rows.append(dict(layer=layer, head=h, part=part, start=float(start[h]), slot=float(on_slot[h]),
                                 prev=float(on_prev[h])))
    split = pd.DataFrame(rows).pivot_table(index=["layer", "head"], columns="part", values=["start", "slot", "prev"],
                                           dropna=False)
    split.columns = [f"mass_{what}_{part}" for what, part in split.columns]
    return heads.merge(split.reset_index(), on=["layer", "head"])


def shares(heads: pd.DataFrame) -> dict:
    """Gu et al.'s shares and counts of heads (mean mass > ``SINK_THRESHOLD``) on ``<s>`` and on the slot,
    ``sink_near_<t>`` (heads within ``NEAR_BAND`` of the threshold), mean and largest masses, the floor."""
    out = {}
    for what in ("start", "slot"):
        col = heads[f"mass_{what}"]
        known = col.notna().all()
        out[f"sink_share_{what}"] = float((col > SINK_THRESHOLD).mean()) if known else np.nan
        out[f"sink_heads_{what}"] = float((col > SINK_THRESHOLD).sum()) if known else np.nan
        out[f"sink_near_{what}"] = float(((col - SINK_THRESHOLD).abs() <= NEAR_BAND).sum()) if known else np.nan
        out[f"uniform_{what}"] = float(heads[f"uniform_{what}"].iloc[0])
        out[f"mean_mass_{what}"] = float(col.mean()) if known else np.nan
        out[f"max_mass_{what}"] = float(col.max()) if known else np.nan
    return out


# ----- one run for experiments.training.sinks.run_arm --------------------------------------------------------


class BackcopyRun:
    """One arm and seed: model, optimiser, batches (a generator per step: resumable), loss, measurement."""

    domain = "backcopy"
    device = torch.device("cpu")  # trains on the CPU (run_arm records it)

    def __init__(self, arm: str, seed: int, recipe: BackcopyRecipe) -> None:
        self.arm, self.seed, self.recipe = check_arm(arm), seed, recipe
        self.task = make_task(recipe)
        gen = torch.Generator().manual_seed(10**9 + recipe.task_seed)  # held out: the same for every arm and seed
        self.eval_seq = generate(self.task, recipe.eval_sequences, recipe.shape.context, gen)

    def build(self) -> nn.Module:
        return build_model(self.arm, self.seed, self.recipe)

    def optimiser(self, model: nn.Module) -> tuple[torch.optim.Optimizer, Any]:
        opt = lm_adamw(model, self.recipe.lr, self.recipe.weight_decay)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, _constant_after_warmup(self.recipe.warmup))

    def batch(self, step: int) -> Tensor:
        gen = torch.Generator().manual_seed(1_000_003 * self.seed + step)
        return generate(self.task, self.recipe.batch, self.recipe.shape.context, gen)

    def loss(self, model: nn.Module, seq: Tensor) -> Tensor:
        logits = target_logits(model, seq, self.arm, self.task.start_id)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1))

    def measure(self, model: nn.Module, step: int) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
        heads = head_masses(model, self.task, self.eval_seq[: self.recipe.probe_sequences], self.arm)
        row = dict(sequences=step * self.recipe.batch, **evaluate(model, self.task, self.eval_seq, self.arm),
                   **shares(heads))
        return row, heads, pd.DataFrame()


def verify_checkpoint(path: Path, fingerprint: str) -> None:
    """Refuse, with one ``CheckpointError`` (a ``StaleResultsError``) naming the file and the fix, a
    checkpoint at ``path`` that cannot be read (empty, truncated: ``sinks.read_checkpoint``) or belongs
    to another run (recipe, arm or seed)."""
    path = Path(path)
    if not path.exists():
        return
    found = read_checkpoint(path)["recipe"]
    if found != fingerprint:
        raise CheckpointError(f"{path} is a checkpoint of run {found}, not of this run's {fingerprint} "
                              "(another recipe, arm or seed): pass another work folder, or delete it")


def gate_check(model: nn.Module, run: BackcopyRun) -> list[dict]:
    """The causal check: the trained model as is (gate 0) and, in a slot arm, with the slot's gate at
    -inf (the slot removed exactly): loss, copy accuracy and where the attention goes."""
    rows = []
    for gate in ((0.0, float("-inf")) if has_slot(model) else (0.0,)):
        if has_slot(model):
            set_slot_gate(model, gate)
        heads = head_masses(model, run.task, run.eval_seq[: run.recipe.probe_sequences], run.arm)
        rows.append(dict(arm=run.arm, seed=run.seed, gate=str(gate), **evaluate(model, run.task, run.eval_seq, run.arm),
                         **shares(heads)))
    if has_slot(model):
        set_slot_gate(model, 0.0)
    return rows


def train_run(arm: str, seed: int, recipe: BackcopyRecipe, work: Path,
              stop_after: Optional[int] = None) -> tuple[nn.Module, dict, BackcopyRun]:
    """Train (or resume, or read back) one run in ``work/<recipe fingerprint>/`` via ``sinks.run_arm``."""
    run, fp = BackcopyRun(arm, seed, recipe), run_fingerprint(recipe, arm, seed)
    folder = Path(work) / recipe_fingerprint(recipe)
    verify_checkpoint(checkpoint_path(folder, run), fp)
    model, state = run_arm(run, folder, fp, stop_after=stop_after)
    return model, state, run
