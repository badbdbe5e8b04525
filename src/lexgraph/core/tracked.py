"""What DVC owns, so that a command writing a path the user names never writes there.

``lexgraph search --run`` (and ``lexgraph regress --update``) write a file the user names.
DVC owns two kinds of paths that such a write would damage:

* its **cache**: a file there is the content of one version of an output, named by its
  hash; overwriting it corrupts that version for every ``dvc checkout`` to come (and, with
  the ``hardlink``/``symlink`` cache types, the workspace copy too). DVC makes cache files
  read-only, but mode bits do not stop root;
* the **outputs** its stages and ``.dvc`` files track: ``dvc repro``/``dvc checkout``
  replace them, and a run written over one changes what ``dvc status`` and the metrics see.

:func:`dvc_owner` says why DVC owns a path (or None), after resolving symlinks. It refuses

* a path inside a ``.dvc`` or ``.git`` directory (whatever repository it belongs to);
* a path inside a DVC cache: ``<root>/.dvc/cache`` and the ``cache.dir`` set in
  ``<root>/.dvc/config``, ``<root>/.dvc/config.local`` or DVC's global and system configs
  (a relative ``cache.dir`` is read from the config file's directory, as DVC reads it), for
  each DVC repository holding the path (a directory with a ``.dvc`` directory) and the
  workspace;
* one of DVC's own files (``dvc.yaml``, ``dvc.lock``, ``*.dvc``, ``.dvcignore``);
* a path at or under an ``outs``, ``metrics`` or ``plots`` entry of a ``dvc.yaml`` (a
  ``foreach``/``matrix`` template such as ``models/gnn_${item}`` matches any item), an
  output of a ``dvc.lock`` stage, an ``outs`` path of a ``*.dvc`` file (each read in every
  directory from the repository root or the workspace down to the path), or a path under
  the workspace's ``data/`` or ``models/`` (:data:`lexgraph.core.layout.MANAGED_ROOTS`,
  which hold every artefact :mod:`lexgraph.core.layout` names).

A ``dvc.yaml``, ``dvc.lock`` or ``*.dvc`` file that cannot be read is a reason too: which
paths it tracks cannot be told.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import yaml

from lexgraph.core import layout
from lexgraph.core.errors import DataError

#: directories whose content only their tools write
SUSPECT_DIRS = (".dvc", ".git")
#: why a path under the workspace's ``data/`` or ``models/`` is DVC's (every artefact of
#: :mod:`lexgraph.core.layout` lies there)
MANAGED = "which `dvc repro` manages"
#: DVC's own files (``*.dvc`` too)
DVC_FILES = ("dvc.yaml", "dvc.lock", ".dvcignore")
_TEMPLATE = re.compile(r"(\$\{[^}]*\})")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def dvc_roots(path: Path) -> list[Path]:
    """``path`` and its ancestors that are DVC repositories (hold a ``.dvc`` directory), nearest first."""
    return [p for p in (path, *path.parents) if _is_dir(p / ".dvc")]


def _config_cache_dir(config: Path) -> Path | None:
    """``cache.dir`` of one DVC config file (configobj syntax), resolved, or None."""
    try:
        text = config.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    section, found = None, None
    for raw in text.split("\n"):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip().strip("'\"").strip()
            continue
        key, eq, value = line.partition("=")
        if section != "cache" or not eq or key.strip() != "dir":
            continue
        value = value.strip()
        if value[:1] in ("'", '"') and value[0] in value[1:]:
            value = value[1 : value.index(value[0], 1)]
        else:
            value = value.split("#", 1)[0].strip()
        if value and not re.match(r"\w+://", value):
            found = value
    if found is None:
        return None
    return (config.parent / os.path.expanduser(found)).resolve()


def _user_configs() -> list[Path]:
    """DVC's global and system config files (``dvc.dirs``: the environment overrides, else XDG)."""
    home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    system = (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep)[0] or "/etc/xdg"
    return [
        Path(os.environ.get("DVC_GLOBAL_CONFIG_DIR") or os.path.join(home, "dvc"), "config"),
        Path(os.environ.get("DVC_SYSTEM_CONFIG_DIR") or os.path.join(system, "dvc"), "config"),
    ]


def cache_dirs(roots: list[Path]) -> list[tuple[Path, str]]:
    """``(cache directory, where it is set)`` of DVC repositories ``roots`` and of DVC's
    global and system configs."""
    out: list[tuple[Path, str]] = []
    for root in roots:
        out.append(((root / ".dvc" / "cache").resolve(), f"the default cache of {root}"))
        for name in ("config", "config.local"):
            config = root / ".dvc" / name
            found = _config_cache_dir(config)
            if found is not None:
                out.append((found, f"cache.dir of {config}"))
    for config in _user_configs():
        found = _config_cache_dir(config)
        if found is not None:
            out.append((found, f"cache.dir of {config}"))
    return out


def _entry_paths(entries) -> Iterator[str]:
    """The paths of an ``outs``/``metrics``/``plots`` list (strings or one-key mappings)."""
    if isinstance(entries, dict):
        entries = list(entries)
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict):
            yield from (str(key) for key in entry)
        elif entry is not None:
            yield str(entry)


def _declared(directory: Path) -> Iterator[tuple[Path, str, str]]:
    """``(base directory, declared path, what declares it)`` for every path the ``dvc.yaml``,
    ``dvc.lock`` and ``*.dvc`` files of ``directory`` track. Raises ``ValueError`` naming a
    file that cannot be read."""
    files = [directory / "dvc.yaml", directory / "dvc.lock"]
    try:
        files += sorted(p for p in directory.glob("*.dvc") if p.is_file())
    except OSError:
        pass
    for file in files:
        try:
            if not file.is_file():
                continue
            spec = yaml.load(file.read_text(encoding="utf-8"), Loader=_LOADER)  # noqa: S506 - a safe loader
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ValueError(
                f"{file} cannot be read ({type(exc).__name__}), so which paths DVC tracks there cannot be told"
            ) from None
        if not isinstance(spec, dict):
            continue
        if file.suffix == ".dvc":
            base = directory / str(spec.get("wdir", "."))
            for entry in spec.get("outs") or []:
                if isinstance(entry, dict) and "path" in entry:
                    yield base, str(entry["path"]), f"tracked by {file}"
            continue
        stages = spec.get("stages") if isinstance(spec.get("stages"), dict) else {}
        for name, stage in stages.items():
            if not isinstance(stage, dict):
                continue
            body = stage["do"] if isinstance(stage.get("do"), dict) else stage
            base = directory / str(body.get("wdir", "."))
            what = f"an output of stage '{name}' in {file}"
            if file.name == "dvc.lock":  # concrete paths, foreach items expanded; metrics and plots are outs
                for entry in body.get("outs") or []:
                    if isinstance(entry, dict) and "path" in entry:
                        yield base, str(entry["path"]), what
                continue
            for key in ("outs", "metrics", "plots"):
                yield from ((base, p, what) for p in _entry_paths(body.get(key)))
        if file.name == "dvc.yaml":
            for key in ("metrics", "plots"):
                for p in _entry_paths(spec.get(key)):
                    yield directory, p, f"a top-level {key} entry of {file}"


def _matches(target: Path, absolute: Path, base: Path, declared: str) -> str | None:
    """How ``target`` (resolved; ``absolute``: before resolving) relates to ``declared``
    (relative to ``base``): "is", "is inside" ("matches", "is inside a match of" for a
    template), or None."""
    declared = os.path.normpath(declared)
    if _TEMPLATE.search(declared):
        regex = re.compile(
            "".join("[^/]*" if part.startswith("${") else re.escape(part) for part in _TEMPLATE.split(declared))
            + "(/.*)?"
        )
        for path, root in ((target, base.resolve()), (absolute, Path(os.path.abspath(base)))):
            try:
                rel = path.relative_to(root).as_posix()
            except ValueError:
                continue
            match = regex.fullmatch(rel)
            if match:
                return "is inside a match of" if match.group(1) else "matches"
        return None
    for path, out in ((target, (base / declared).resolve()), (absolute, Path(os.path.abspath(base / declared)))):
        if _within(path, out):
            return "is" if path == out else "is inside"
    return None


def dvc_owner(path: str | os.PathLike, workspace: str | os.PathLike = ".") -> str | None:
    """Why DVC owns ``path`` (a sentence part such as ``"is inside DVC's cache /w/.dvc/cache"``),
    or None when it does not (see the module docstring)."""
    absolute = Path(os.path.abspath(path))
    try:
        target = absolute.resolve()
    except (RuntimeError, OSError):  # a symbolic link loop (RuntimeError before Python 3.13)
        raise DataError(path, "a symbolic link loop; not written, expected a file or a link to one") from None
    for candidate in (absolute, target):
        for i, part in enumerate(candidate.parts):
            if part in SUSPECT_DIRS:
                where = "is" if i == len(candidate.parts) - 1 else "is inside"
                return f"{where} {Path(*candidate.parts[: i + 1])}, a directory only {part[1:]} writes"
    if target.name in DVC_FILES or target.suffix == ".dvc" or absolute.name in DVC_FILES or absolute.suffix == ".dvc":
        return f"is {target.name}, one of DVC's own files"
    workspace = Path(os.path.abspath(workspace)).resolve()
    roots = dvc_roots(target.parent)
    for root in dvc_roots(absolute.parent) + dvc_roots(workspace):
        if root not in roots:
            roots.append(root)
    for cache, where in cache_dirs(roots):
        if _within(target, cache) or _within(absolute, cache):
            return f"is inside DVC's cache {cache} ({where})"
    for managed in layout.MANAGED_ROOTS:
        if _within(target, (workspace / managed).resolve()) or _within(absolute, workspace / managed):
            return f"is inside {workspace / managed}, {MANAGED}"
    repos = [r for r in roots if _within(target, r)] + ([workspace] if _within(target, workspace) else [])
    seen: set[Path] = set()
    for root in repos:
        directories = [root] + [p for p in reversed(target.parents) if root in p.parents]
        for directory in directories:
            if directory in seen:
                continue
            seen.add(directory)
            try:
                for base, declared, what in _declared(directory):
                    how = _matches(target, absolute, base, declared)
                    if how:
                        return f"{how} {declared}, {what}"
            except ValueError as exc:
                return f"is in {directory}, where {exc}"
    return None
