"""The walls between modules: imports go downward only, no function over 60 lines, no surgery."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "interp"

# Lowest layer first. A module may import only from layers strictly below its own.
LAYERS = [
    ["interp._version", "interp._lazy", "interp.errors", "interp.types", "interp.record.hooks"],
    ["interp.record.moments", "interp.figures.plot_checks", "interp.figures.colours"],
    ["interp.checks", "interp.io", "interp.bootstrap", "interp.models.builders", "interp.models.adapters.common", "interp.models.folder",
     "interp.figures.single_input_plots", "interp.models.external"],
    ["interp.ablation.options"],
    ["interp.models.adapters.dinov2", "interp.models.adapters.beit", "interp.models.adapters.clip",
     "interp.models.adapters.timm_vit", "interp.figures.plots", "interp.figures.interactive", "interp.models.audit"],
    ["interp.models.adapters.open_clip_vit"],
    ["interp.models.adapters"],
    ["interp.models.families"],
    ["interp.models.info", "interp.models.zoo"],
    ["interp.models.digits"],
    ["interp.models.bridge"],
    ["interp.models.tiny", "interp.models.loading"],
    ["interp.record.heads", "interp.data.batch", "interp.record.fingerprint"],
    ["interp.data.sources"], ["interp.data.builtin"], ["interp.data.iterate"],
    ["interp.data", "interp.fetch"],
    ["interp.record.stats_format"], ["interp.record.stats_dist"], ["interp.record.stats"],
    ["interp.record.patching", "interp.record.capture"], ["interp.record.recording", "interp.analysis.origin_intervals", "interp.ablation.logits"],
    ["interp.analysis.origin", "interp.analysis.scores", "interp.analysis.frequency",
     "interp.ablation.variants", "interp.ablation.metrics", "interp.ablation.log", "interp.ablation.control"],
    ["interp.analysis.sink_parts"], ["interp.analysis.sinks", "interp.analysis.single_input"], ["interp.analysis.high_norm", "interp.analysis.sink_intervals"],
    ["interp.analysis", "interp.ablation.attribution", "interp.ablation.implicit"],
    ["interp.ablation.distance"], ["interp.ablation.memory"],
    ["interp.ablation.sweep"],
    ["interp.ablation"], ["interp.report.sections"],
    ["interp.report.pipeline", "interp.report.single_input_run"],
    ["interp.report.html"],
    ["interp.report.demo", "interp.compare"],
    ["interp.cli", "interp.models", "interp.testing", "interp.record", "interp.figures", "interp.report", "interp"],
]
RANK = {module: rank for rank, layer in enumerate(LAYERS) for module in layer}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def interp_imports(tree: ast.AST, name: str):
    """(imported interp module, line, inside a function?) for every import statement."""
    package = name if MODULES[name].name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                continue  # annotations only: nothing is imported at run time
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_function) for a in child.names if a.name.startswith("interp"))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1] + [base]).strip(".")
                if base.startswith("interp"):
                    for alias in child.names:  # `from interp.x import submodule` imports the submodule
                        full = f"{base}.{alias.name}"
                        found.append((full if full in MODULES else base, child.lineno, in_function))
            visit(child, inner)

    visit(tree, False)
    return found


def layer_diagram() -> str:
    """docs/development.md's layer diagram, generated from LAYERS (top layer first, one line per layer)."""
    lines = []
    for rank in range(len(LAYERS) - 1, -1, -1):
        names = ", ".join(m.removeprefix("interp.") if m != "interp" else "interp" for m in LAYERS[rank])
        lines.append(names)
    return "\n".join(["```", *lines, "```"])


def readme_block(text: str) -> str:
    start, end = "<!-- layers:start -->", "<!-- layers:end -->"
    assert start in text and end in text, "docs/development.md needs the generated layers block (run tests/test_structure.py)"
    return text.split(start, 1)[1].split(end, 1)[0].strip()


DIAGRAM_PAGE = PACKAGE.parent / "docs" / "development.md"


def test_docs_diagram_is_the_layer_table():
    page = DIAGRAM_PAGE.read_text()
    assert readme_block(page) == layer_diagram(), "docs/development.md's diagram drifted: python tests/test_structure.py"


def test_models_import_no_data_and_no_training():
    for name, path in MODULES.items():
        if name.startswith("interp.models"):
            for target, line, _ in interp_imports(ast.parse(path.read_text()), name):
                assert not target.startswith(("interp.data", "experiments.training", "interp.fetch")), \
                    f"{name}:{line} imports {target}: models sit below data and training"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_the_library_never_imports_experiments_tools_or_benchmarks(name):
    """experiments/, tools/ and benchmarks/ use the library; they are not installed, so it cannot use them."""
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            assert not any(t.split(".")[0] in ("experiments", "tools", "benchmarks") for t in targets), \
                f"{name}:{node.lineno} imports {targets}"


def test_the_package_root_is_a_handful_of_modules():
    """The root holds packages that name their concern and a few modules (the cap is the one we keep)."""
    root_modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root_modules) <= 12, f"interp/ has {len(root_modules)} modules: {root_modules}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_class_over_150_lines(name):
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.ClassDef):
            length = node.end_lineno - node.lineno + 1
            assert length <= 150, f"{name}.{node.name} is {length} lines long"


# Modules whose properties are tested in a module named for what it tests together: the test names one
# of the module's public names, or (file, evidence) where the module is reached through what the
# evidence names (an estimate, an analyzer, a loader). Every other module with logic has
# tests/<same path>/test_<module>.py.
TESTED_IN = {
    "interp.ablation.attribution": ("tests/ablation/test_sweep.py", "atp"),  # estimates against exact rows
    "interp.ablation.metrics": "tests/test_batching_invariance.py",
    "interp.analysis.single_input": "tests/analysis/test_single_input.py",
    "interp.analysis.origin": "tests/analysis/test_analysis.py",
    "interp.analysis.origin_intervals": ("tests/analysis/test_intervals.py", "n_boot"),
    "interp.analysis.sink_parts": ("tests/analysis/test_sinks.py", "sink_profile"),
    "interp.bootstrap": "tests/ablation/test_uncertainty.py",
    "interp.data.batch": "tests/data/test_sources.py",  # the image preprocessing, read through resolve_data
    "interp.data.builtin": "tests/models/test_zoo.py",
    "interp.report.demo": "tests/report/test_pipeline.py",
    "interp.errors": "tests/test_every_exception_ours.py",
    "interp.figures.interactive": "tests/figures/test_interactive_figures.py",
    "interp.io": "tests/test_faults.py",
    "interp.models.bridge": ("tests/models/test_loading.py", "load_model"),
    "interp.models.folder": ("tests/models/test_loading.py", "save_pretrained"),
    "interp.models.info": ("tests/models/test_families.py", "model.interp"),
    "interp.models.tiny": "tests/models/test_families.py",
    "interp.report.single_input_run": ("tests/test_cli.py", "single-input"),
    "interp.models.builders": "tests/models/test_families.py",
    "interp.record.patching": "tests/test_properties.py",
    "interp.models.digits": "tests/models/test_timm_port.py",
    "interp.figures.plot_checks": "tests/figures/test_plots.py",
    "interp.figures.single_input_plots": "tests/analysis/test_single_input.py",
    "interp.record.stats_dist": ("tests/record/test_recording.py", "all_reduce"),
    "interp.record.stats_format": "tests/record/test_stats.py",
}
# the adapters are tested through the family registry (tests parametrised over list_families())
REGISTRY_TESTS = "tests/models/test_families.py"


def _public_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_tests_mirror_the_package(name):
    path = MODULES[name]
    if path.name == "__init__.py" or path.stem.startswith("_") or not any(
            isinstance(n, ast.FunctionDef) for n in ast.walk(ast.parse(path.read_text()))):
        return  # a package face or a module of constants: nothing to test on its own
    mirror = PACKAGE.parent / "tests" / path.relative_to(PACKAGE).parent / f"test_{path.stem}.py"
    if mirror.exists():
        return
    root = PACKAGE.parent
    if name.startswith("interp.models.adapters."):
        assert "list_families" in (root / REGISTRY_TESTS).read_text()
        return
    assert name in TESTED_IN, f"{name} has logic but no {mirror.relative_to(root)} (or an entry in TESTED_IN)"
    where, evidence = TESTED_IN[name] if isinstance(TESTED_IN[name], tuple) else (TESTED_IN[name], None)
    text = (root / where).read_text()
    if evidence is not None:
        assert evidence in text, f"{where} no longer reaches {name} through {evidence!r}"
        return
    assert name in text or any(re.search(rf"\b{n}\b", text) for n in _public_names(path)), \
        f"{where} does not use {name}"


def test_every_module_has_a_layer():
    assert set(MODULES) <= set(RANK), f"place these modules in LAYERS: {sorted(set(MODULES) - set(RANK))}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_go_down_only(name):
    tree = ast.parse(MODULES[name].read_text())
    for target, line, in_function in interp_imports(tree, name):
        if name == "interp.cli":
            continue  # the command imports lazily, so `interp --help` stays fast
        assert not in_function, f"{name}:{line} imports {target} inside a function"
        own_package = target.startswith(name + ".") and MODULES[name].name == "__init__.py"
        if own_package:
            continue  # a package re-exports its own submodules
        assert RANK[target] < RANK[name], f"{name}:{line} imports {target}, which is not in a layer below it"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_function_over_60_lines(name):
    tree = ast.parse(MODULES[name].read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            assert length <= 60, f"{name}.{node.name} is {length} lines long"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_surgery_on_the_bridge(name):
    text = MODULES[name].read_text()
    assert "._original_component" not in text, f"{name} rewrites the bridge's parameter names"
    assert "__class__ =" not in text, f"{name} swaps a class"
    assert '__dict__["' not in text, f"{name} writes or reads an object's __dict__ directly"
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformer_lens"):
            private = [part for part in node.module.split(".") if part.startswith("_")]
            assert not private, f"{name} imports TransformerLens' private module {node.module}"


def test_import_has_no_side_effects():
    import subprocess
    import sys

    code = ("import matplotlib, sys; before = matplotlib.get_backend() if 'matplotlib.pyplot' in sys.modules "
            "else None; import interp; import matplotlib.pyplot; "
            "assert matplotlib.rcParams['backend'] is not None; print(matplotlib.get_backend())")
    env_backend = subprocess.run([sys.executable, "-c", "import matplotlib; print(matplotlib.get_backend())"],
                                 capture_output=True, text=True, env={"MPLBACKEND": "svg", "PATH": ""}).stdout
    after = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={"MPLBACKEND": "svg", "PATH": "", "HF_HUB_OFFLINE": "1"})
    assert after.returncode == 0, after.stderr[-1000:]
    assert after.stdout.strip() == env_backend.strip() == "svg"  # interp did not switch the backend


def test_public_names_are_exported():
    import interp

    for name in interp.__all__:
        assert hasattr(interp, name), name
    for name in ("load_model", "record_qkv", "origin_shift", "ablate_bias", "builtin_batches", "list_families",
                 "register_family", "get_family", "merge_shards", "open_data", "QKVStats", "sink_profile"):
        assert name in interp.__all__
    for fixture_or_internal in ("tiny_hf_model", "tiny_inputs", "require_bridge", "kv_group"):
        assert fixture_or_internal not in interp.__all__
    from interp.testing import tiny_hf_model

    assert getattr(interp.tiny_hf_model, "__wrapped__", None) is tiny_hf_model  # still reachable (guarded)


def _used_beyond(name: str, own: Path, texts: dict[Path, str]) -> bool:
    word = re.compile(rf"\b{re.escape(name)}\b")
    return any(word.search(text) for path, text in texts.items() if path != own)


def test_every_public_name_is_used_beyond_its_module():
    """A module-level function or class without a leading underscore is part of what a reader takes as the
    library's surface: it is exported (``interp.__all__`` or its module's ``__all__``), or something else uses it
    (another module, a test, an experiment, a benchmark, a tool, a page). Otherwise it is a private helper, named
    as one."""
    root = PACKAGE.parent
    texts = {p: p.read_text() for folder in ("interp", "tests", "experiments", "benchmarks", "tools", "docs")
             for p in (root / folder).rglob("*") if p.suffix in (".py", ".md") and ".venv" not in p.parts}
    texts.update({p: p.read_text() for p in (root / "notebooks").glob("*.ipynb")})
    lonely = []
    for path in MODULES.values():
        if path == PACKAGE / "models" / "builders.py":  # the tiny builders: found by family name (families.py)
            continue
        tree = ast.parse(path.read_text())
        exported = {e.value for node in tree.body if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", None) == "__all__" for t in node.targets)
                    for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
        for node in tree.body:
            if (isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")
                    and node.name not in exported and not _used_beyond(node.name, path, texts)):
                lonely.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    assert not lonely, "public names nothing else uses (prefix them with _, or export them): " + ", ".join(lonely)


if __name__ == "__main__":  # regenerate docs/development.md's diagram from LAYERS
    readme_path = DIAGRAM_PAGE
    text = readme_path.read_text()
    readme_path.write_text(text.replace(readme_block(text), layer_diagram()))
    print(f"wrote the layers block of {readme_path}")
