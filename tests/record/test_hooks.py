"""One vocabulary for hook names: interp.record.hooks spells them, nothing else in the package does."""

import re
from pathlib import Path

from interp.record.hooks import attn_hook, block_hook, hook_name, is_block_hook

PACKAGE = Path(__file__).resolve().parents[2] / "interp"
# Not hook names: timm state-dict keys of the digits ViT's conversion (``blocks.{i}.attn.qkv.weight``).
NOT_HOOKS = {"models/digits.py"}
HAND_SPELLED = re.compile(r"""f["']blocks\.|["']blocks\.\{""")


def test_names_are_transformerlens():
    assert hook_name(3, "q") == "blocks.3.attn.hook_q"
    assert hook_name(0, "pattern") == "blocks.0.attn.hook_pattern"
    assert attn_hook(2, "o.hook_out") == "blocks.2.attn.o.hook_out"
    assert attn_hook(2, "q.hook_in") == "blocks.2.attn.q.hook_in"
    assert block_hook(5, "hook_out") == "blocks.5.hook_out"
    assert is_block_hook(hook_name(1, "k")) and not is_block_hook("embed.hook_out")


def test_bridge_has_every_name_the_vocabulary_builds():
    import interp
    from interp.models import tiny_hf_model

    model = interp.load_model(tiny_hf_model("gpt2"), device="cpu")
    names = set(model.hook_dict)
    built = [hook_name(0, k) for k in ("q", "k", "v", "z", "pattern")]
    built += [attn_hook(0, "o.hook_out"), attn_hook(0, "q.hook_in"), block_hook(0, "hook_out")]
    assert set(built) <= names, sorted(set(built) - names)


def test_no_hook_name_is_spelled_by_hand_outside_the_vocabulary():
    found = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in {"record/hooks.py"} | NOT_HOOKS:
            continue
        found += [f"{rel}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1) if HAND_SPELLED.search(line)]
    assert not found, f"build hook names with interp.record.hooks: {found}"
