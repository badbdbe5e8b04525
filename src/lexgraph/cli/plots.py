"""``lexgraph plots-offline``: a ``dvc plots show`` page that needs no network.

DVC's default page (``dvc_render``) loads Vega, Vega-Lite and Vega-Embed from a CDN, so offline
it renders nothing. This writes an HTML template with the three libraries inlined, taken from
the ``vl-convert-python`` wheel (a dev extra: :func:`vl_convert.javascript_bundle` returns
them as one script, built from the copies inside the wheel, with no download), to
:data:`TEMPLATE` under the workspace's ``.dvc`` directory, and points DVC's ``plots.html_template``
at it in ``.dvc/config.local`` (this checkout only; git ignores both). ``dvc plots show`` then
writes ``dvc_plots/index.html`` with no ``<script src="http...">``.

The template has no ``{scripts}`` placeholder: that is where DVC would put the CDN tags."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lexgraph.cli.commands import add_command, workspace_option
from lexgraph.core.errors import LexgraphError
from lexgraph.core.inputs import require_directory, shown_path

#: the template, relative to the workspace's ``.dvc`` directory (DVC reads ``plots.html_template`` so)
TEMPLATE = "plots/offline.html"

#: DVC's plot templates are Vega-Lite v5 specifications (``$schema`` .../vega-lite/v5.json)
VEGA_LITE = "5.21"

#: what DVC fills in the template (``dvc_render.html.HTML``); the inlined code must contain none
PLACEHOLDERS = ("{plot_divs}", "{refresh_tag}", "{scripts}")

PAGE = """<!DOCTYPE html>
<html>
<head>
    {refresh_tag}
    <meta charset="utf-8">
    <title>DVC Plot</title>
    <!-- Vega, Vega-Lite VEGA_LITE_VERSION and Vega-Embed, inlined by `lexgraph plots-offline` from
         vl-convert-python VL_CONVERT_VERSION: this page loads nothing from the network -->
    <script type="text/javascript">
(function () {
"use strict";
BUNDLE
})();
    </script>
    <style>
        table {
            border-spacing: 15px;
        }
    </style>
</head>
<body>
    {plot_divs}
</body>
</html>
"""


def offline_page() -> str:
    """The HTML template: DVC's page with the Vega libraries inlined (the bundle defines
    ``window.vega``, ``window.vegaLite`` and ``window.vegaEmbed``, which DVC's plot divs call)."""
    try:
        import vl_convert
    except ImportError as exc:
        raise LexgraphError(
            "plots-offline needs vl-convert-python, which ships the Vega JavaScript "
            "(pip install -e '.[dev]' installs it)"
        ) from exc
    try:
        bundle = vl_convert.javascript_bundle(vl_version=VEGA_LITE)
    except (ValueError, RuntimeError) as exc:  # the Rust side raises RuntimeError, with a backtrace
        reason = (str(exc).strip().splitlines() or ["no message"])[0]
        raise LexgraphError(
            f"vl-convert-python {vl_convert.__version__} has no Vega-Lite {VEGA_LITE} bundle ({reason}); "
            "expected the version pyproject.toml's dev extra names"
        ) from exc
    found = [p for p in PLACEHOLDERS if p in bundle]
    if found or "</script" in bundle.lower():
        raise LexgraphError(
            f"vl-convert-python {vl_convert.__version__}: its Vega bundle contains "
            f"{', '.join(found) or '</script'}, which would break the page; install another version"
        )
    return (
        PAGE.replace("VEGA_LITE_VERSION", VEGA_LITE)
        .replace("VL_CONVERT_VERSION", vl_convert.__version__)
        .replace("BUNDLE", bundle)
    )


def install_offline_page(workspace: Path) -> Path:
    """Write :func:`offline_page` to ``<workspace>/.dvc/`` :data:`TEMPLATE` and set
    ``plots.html_template`` in ``.dvc/config.local``; return the template's path."""
    from lexgraph.core.io import write_text

    require_directory(workspace, label="--workspace", expected="a DVC workspace, the directory with .dvc/ and dvc.yaml")
    dvc_dir = workspace / ".dvc"
    if not dvc_dir.is_dir():
        raise LexgraphError(
            f"--workspace {shown_path(workspace)}: no .dvc directory there; expected a DVC workspace, the "
            "directory with .dvc/ and dvc.yaml (run lexgraph there, or pass --workspace DIR)"
        )
    target = dvc_dir / TEMPLATE
    page = offline_page()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text(page, target)
    except OSError as exc:
        raise LexgraphError(f"{target}: cannot write the offline page ({exc.strerror or exc})") from exc
    command = [sys.executable, "-m", "dvc", "config", "--local", "plots.html_template", TEMPLATE]
    done = subprocess.run(command, cwd=workspace, capture_output=True, encoding="utf-8", errors="replace")
    if done.returncode:
        lines = done.stderr.strip().splitlines() or ["no message"]
        raise LexgraphError(f"{workspace}: `dvc config --local plots.html_template` failed: {lines[-1]}")
    return target


def cmd_plots_offline(args) -> int:
    """``lexgraph plots-offline``: install the page, say where it is."""
    target = install_offline_page(Path(args.workspace))
    print(f"wrote {target}; `dvc plots show` now needs no network")
    return 0


def add_plots_offline(sub) -> None:
    """The ``plots-offline`` subcommand of ``lexgraph`` (``sub``: its subparsers)."""
    p = add_command(
        sub,
        "plots-offline",
        cmd_plots_offline,
        "make `dvc plots show` work offline (Vega inlined in its HTML template)",
        "Write an HTML template for `dvc plots show` with Vega, Vega-Lite and Vega-Embed "
        "inlined and set plots.html_template in .dvc/config.local, so the page loads nothing from the network.",
    )
    workspace_option(p, "the DVC workspace (with .dvc/)")
