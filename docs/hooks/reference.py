"""MkDocs hook: writes the configuration reference (``reference/configuration.md``) at build time.

The page is generated from the two places that define what a configuration may hold, so that it
cannot fall behind them: the strategy registry (:data:`plnexp.strategies.STRATEGIES`: each entry's
name, options with their defaults, allowed values and meaning) and the config groups under
``conf/`` (each group's options and their yaml). ``mkdocs.yml`` names this file under ``hooks:``;
``tests/test_docs.py`` calls :func:`render` to check that the page names every strategy, option,
group and key.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

import yaml

PAGE = "reference/configuration.md"
ROOT = Path(__file__).resolve().parents[2]

# the group options Hydra itself provides (not files under conf/), named so that the page says where they are
HYDRA_LAUNCHERS = (
    ("basic", "Hydra's default: the jobs one after the other in one process (the timing study's launcher)"),
    ("joblib", "the jobs in parallel worker processes (`hydra.launcher.n_jobs`; hydra-joblib-launcher)"),
    ("submitit_slurm", "Hydra's own SLURM launcher (the `cluster` extra), without plnexp's one-line-per-job wait"),
)


def on_files(files, config):
    """Adds the generated page to the site's files (before the navigation is built)."""
    from mkdocs.structure.files import File

    conf = Path(config.config_file_path).resolve().parent / "conf"
    files.append(File.generated(config, PAGE, content=render(conf)))
    return files


# a Sphinx role as mkdocstrings renders it from a docstring (``:class:`X` `` -> ``:class:<code>X</code>``)
SPHINX_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):<code>(~?)([\w.]+)</code>")


def _role(match: re.Match) -> str:
    tilde, target = match.groups()
    text = target.rsplit(".", 1)[-1] if tilde else target
    if "." in target:  # a link where the target is documented on the site, plain code otherwise
        return f'<code><autoref identifier="{target}" optional>{text}</autoref></code>'
    return f"<code>{text}</code>"


def on_page_content(html, page, config, files):
    """plnexp's docstrings use Sphinx roles (``:class:`X` ``), which mkdocstrings leaves as text:
    each becomes code, linked (by mkdocs-autorefs) where its target is documented on the site."""
    return SPHINX_ROLE.sub(_role, html)


def _comments(path: Path) -> list[str]:
    """The comment lines at the top of a yaml file (after ``# @package``), without their ``#``."""
    out = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if not text.startswith("@package"):
            out.append(text)
    return out


def _key_comments(path: Path) -> dict[str, str]:
    """Top-level key -> the comment on its line and on the comment-only lines that follow it."""
    out: dict[str, str] = {}
    key = None
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z_][\w]*):(.*)$", line)
        if m:
            key = m.group(1)
            _, _, comment = m.group(2).partition(" #")
            out[key] = comment.strip()
        elif key and re.match(r"^\s+#", line):
            out[key] = (out[key] + " " + line.strip().lstrip("#").strip()).strip()
        else:
            key = None
    return out


def _code(value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    text = text.removesuffix("\n...").removesuffix("...").strip()
    return f"`{text}`"


def _cell(text: str) -> str:
    """Text for a Markdown table cell: no pipes, no newlines, no ``<`` read as the start of an HTML tag."""
    return text.replace("<", "&lt;").replace("|", "\\|").replace("\n", " ")


def _defaults(conf: Path) -> dict[str, str]:
    """group -> its default option, from conf/config.yaml's defaults list."""
    out: dict[str, str] = {}
    for item in yaml.safe_load((conf / "config.yaml").read_text()).get("defaults", []):
        if isinstance(item, dict):
            for group, option in item.items():
                if not group.startswith("override "):
                    out[group] = "null" if option is None else option
    return out


def _groups(conf: Path) -> list[tuple[str, list[Path]]]:
    """(group, its yaml files) for every folder under conf/ holding yaml files, sorted."""
    out = []
    for folder in sorted(p for p in conf.rglob("*") if p.is_dir()):
        options = sorted(folder.glob("*.yaml"))
        if options:
            out.append((folder.relative_to(conf).as_posix(), options))
    return out


def strategies_section(conf: Path) -> list[str]:
    from plnexp.strategies import NATIVE_STRATEGIES, STRATEGIES, TORCH_STRATEGIES

    lines = [
        "## Strategies",
        "",
        "Every entry of `plnexp.strategies.STRATEGIES` (`plnexp.STRATEGIES`), in the registry's order. "
        "Choose one with `strategy=NAME`; its options are `strategy.KEY=VALUE` on the command line and "
        "keyword arguments of `plnexp.fit` (which ignores the options of other strategies). An option "
        "the chosen strategy does not have is refused in one line naming the keys it has.",
        "",
        "| strategy | options | `replicates` > 1 | needs |",
        "|---|---|---|---|",
    ]
    for name, entry in STRATEGIES.items():
        opts = ", ".join(f"`{f.name}`" for f in fields(entry.options)) or "-"
        needs = []
        if name in TORCH_STRATEGIES:
            needs.append('the `torch` extra (`pip install -e ".[torch]"`)')
        if name in NATIVE_STRATEGIES:
            needs.append("the scan_fused kernel, built at install time with a C++ compiler")
        lines.append(
            f"| [`{name}`](#strategy-{name}) | {opts} | {'yes' if entry.batches else 'no'} | {'; '.join(needs) or '-'} |"
        )
    lines.append("")
    for name, entry in STRATEGIES.items():
        lines += [f"### `{name}` {{#strategy-{name}}}", ""]
        yaml_file = conf / "strategy" / f"{name}.yaml"
        description = getattr(entry, "description", None) or getattr(entry, "doc", None)
        if not description and yaml_file.is_file():
            description = " ".join(c for c in _comments(yaml_file) if not c.startswith("Its own options only"))
        if description:
            lines += [_cell(description) + ("" if description.endswith(".") else "."), ""]
        facts = []
        if yaml_file.is_file():
            facts.append(f"config file `conf/strategy/{name}.yaml`")
        else:
            facts.append(f"no file under `conf/strategy/`: chosen with `strategy.name={name}`")
        facts.append("batches `replicates=K` (one vmapped program)" if entry.batches else "one fit per program")
        if not entry.jax_cache:
            facts.append("compiles outside JAX: `compile_cache=true` is refused")
        if name in TORCH_STRATEGIES:
            facts.append('needs the `torch` extra (`pip install -e ".[torch]"`)')
        if name in NATIVE_STRATEGIES:
            facts.append("needs the native kernel built at install time (a C++ compiler)")
        sentence = "; ".join(facts)
        lines += [sentence[0].upper() + sentence[1:] + ".", ""]
        opts = fields(entry.options)
        if not opts:
            lines += ["No options of its own.", ""]
            continue
        lines += [
            "| option | default | allowed values | meaning | in a run name |",
            "|---|---|---|---|---|",
        ]
        for f in opts:
            meta = f.metadata
            default = "required" if f.default is MISSING else _code(f.default)
            in_name = meta.get("in_name", "{key}{value}").format(key=f.name, value="VALUE")
            lines.append(
                f"| `strategy.{f.name}` | {default} | {_cell(str(meta.get('allowed', '-')))} | "
                f"{_cell(meta.get('doc', '') or '-')} | `{in_name}` when set away from the default |"
            )
        lines.append("")
    return lines


def top_level_section(conf: Path) -> list[str]:
    from plnexp.jobs import config as C
    from plnexp.jobs.schema import allowed_values

    config = yaml.safe_load((conf / "config.yaml").read_text())
    comments = _key_comments(conf / "config.yaml")
    # the allowed values each key's field declares (plnexp.jobs.schema); n_iter: the field it loads into
    allowed = allowed_values(C.Config) | {f"report.{k}": v for k, v in allowed_values(C.ReportSpec).items()}
    allowed["n_iter"] = allowed.pop("n_iter_requested")
    lines = [
        "## Top-level keys",
        "",
        "From `conf/config.yaml`; each is `KEY=VALUE` on the command line (a sweep file may set its own).",
        "Allowed values: as each key's field in `plnexp.jobs.config` declares them (`plnexp.jobs.schema`), "
        "where the key has a simple rule; the others are checked where they are read.",
        "",
        "| key | default | allowed values | meaning |",
        "|---|---|---|---|",
    ]
    for key, value in config.items():
        if key in ("defaults", "hydra"):
            continue
        rule = allowed.get(key, "")
        if isinstance(value, dict):  # report: its keys' rules
            rule = "; ".join(f"{k.split('.', 1)[1]}: {v}" for k, v in allowed.items() if k.startswith(f"{key}."))
        lines.append(f"| `{key}` | {_code(value)} | {_cell(rule or '-')} | {_cell(comments.get(key, '') or '-')} |")
    lines += [
        "",
        "Two more keys exist only on the command line of `sweep`: `resume=true` (skip the jobs that "
        "FINISHED earlier, see [Reruns and resume](../how-to/reruns.md)) and `report=false` (no report at the end).",
        "",
    ]
    return lines


def groups_section(conf: Path) -> list[str]:
    from plnexp.core.optim import DEFAULT_LR

    defaults = _defaults(conf)
    lines = [
        "## Config groups",
        "",
        "Each folder under `conf/` is a group; `GROUP=OPTION` picks one of its files (`sweep=NAME` a "
        "grid, `hydra/launcher=NAME` a launcher), and `GROUP.KEY=VALUE` sets one of its keys. A bad "
        "value fails before any work, in one line naming the key and the allowed values. "
        "`python -m plnexp run --help` lists the same groups.",
        "",
        "| group | default | options |",
        "|---|---|---|",
    ]
    groups = _groups(conf)
    for group, options in groups:
        default = defaults.get(group, "-" if group != "hydra/launcher" else "basic (Hydra's)")
        names = ", ".join(f"`{p.stem}`" for p in options)
        if group == "hydra/launcher":
            names += ", " + ", ".join(f"`{n}` (Hydra's)" for n, _ in HYDRA_LAUNCHERS)
        anchor = "group-" + group.replace("/", "-")
        lines.append(f"| [`{group}`](#{anchor}) | `{default}` | {names} |")
    lines.append("")
    for group, options in groups:
        anchor = "group-" + group.replace("/", "-")
        lines += [f"### `{group}` {{#{anchor}}}", ""]
        if group in defaults:
            lines += [
                f"Default: `{group}={defaults[group]}`"
                + (
                    " (no sweep file: `python -m plnexp sweep` alone means `sweep=default`)"
                    if defaults[group] == "null"
                    else ""
                )
                + ".",
                "",
            ]
        if group == "strategy":
            lines += [
                "Each file holds the strategy's name and its options only: see [Strategies](#strategies) above.",
                "",
            ]
        if group == "optimizer":
            lines += [
                "`lr: null` takes the optimizer's default learning rate (`plnexp.core.optim.DEFAULT_LR`): "
                + ", ".join(
                    f"`{k}` {v if v is not None else 'none (its steps are clipped at 0.1)'}"
                    for k, v in DEFAULT_LR.items()
                )
                + ".",
                "",
            ]
        if group == "hydra/launcher":
            lines += ["Hydra's own launchers of this group:", ""]
            lines += [f"- `{n}`: {what}" for n, what in HYDRA_LAUNCHERS]
            lines += ["", "plnexp's own:", ""]
        for path in options:
            lines += [
                f"#### `{group}={path.stem}`",
                "",
                f"`conf/{group}/{path.name}`:",
                "",
                "```yaml",
                path.read_text().rstrip(),
                "```",
                "",
            ]
    return lines


def render(conf: Path | str = ROOT / "conf") -> str:
    """The configuration reference page, in Markdown."""
    conf = Path(conf)
    lines = [
        "# Configuration reference",
        "",
        "<!-- generated at build time by docs/hooks/reference.py: edit the registry or conf/, not this page -->",
        "",
        "Generated when the site is built, from the strategy registry (`plnexp.strategies.STRATEGIES`) "
        "and the config groups under `conf/` (`plnexp/conf` inside an installed package). Every value "
        "below is a Hydra override of `python -m plnexp run` and `python -m plnexp sweep`; "
        "[Run experiments](../how-to/experiments.md) shows them in use.",
        "",
    ]
    lines += top_level_section(conf)
    lines += strategies_section(conf)
    lines += groups_section(conf)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render())
