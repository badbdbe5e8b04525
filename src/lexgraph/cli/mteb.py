"""``lexgraph mteb --system S [--task T] [--split SPLIT] [--workspace W] OUT``: a dense system through
MTEB 2's own evaluation, results written in MTEB's format under ``OUT``.

``--task workspace`` (the default) is the workspace's own labelled split
(:func:`lexgraph.systems.mteb_adapter.workspace_task`), offline; any other name is a task of MTEB's
registry (``BSARDRetrieval.v2``), whose data ``mteb`` fetches from the Hugging Face hub.
"""

from __future__ import annotations

import logging
from pathlib import Path

from lexgraph.cli.commands import add_command, dense_system_option, device_option, workspace_option

log = logging.getLogger("lexgraph")


def _task(name: str, split: str, workspace: Path):
    from lexgraph.core.errors import LexgraphError
    from lexgraph.systems.mteb_adapter import WORKSPACE_TASK, workspace_task

    if name == WORKSPACE_TASK:
        return workspace_task(workspace, split)
    import mteb

    try:
        return mteb.get_task(name)
    except KeyError as exc:
        raise LexgraphError(f"--task {name}: not a task of mteb {mteb.__version__}'s registry ({exc})") from None


def cmd_mteb(args) -> int:
    from lexgraph.cli.main import _check_workspace
    from lexgraph.core.config import resolve_device
    from lexgraph.core.errors import LexgraphError
    from lexgraph.core.hub import HubUnreachableError, first_line, hub_access, offline_requested, unreachable_reason
    from lexgraph.systems.export import check_system

    check_system(args.system)
    workspace = Path(args.workspace)
    _check_workspace(workspace)
    try:
        import mteb
    except ImportError:
        raise LexgraphError("lexgraph mteb needs mteb 2: pip install 'lexgraph[mteb]' (or 'mteb>=2.26')") from None
    from lexgraph.systems.mteb_adapter import MTEBEncoder

    print(f"lexgraph mteb: loading {args.system} from {workspace}", flush=True)
    task = _task(args.task, args.split, workspace)
    model = MTEBEncoder.load(args.system, workspace, str(resolve_device(args.device, where="--device")))
    requested = offline_requested()
    with hub_access() as online:  # a registry task's data set comes from the hub
        try:
            result = mteb.evaluate(
                model, task, cache=mteb.ResultCache(args.out), overwrite_strategy="always", show_progress_bar=False
            )
        except OSError as exc:
            reason = first_line(exc) if online else unreachable_reason(args.task, requested)
            raise HubUnreachableError(
                f"MTEB task {args.task}: its data set could not be loaded ({reason}); run it on a machine that "
                "reaches the Hugging Face hub, or use --task workspace"
            ) from None
    for task_result in result.task_results:
        for split, scores in task_result.scores.items():
            main = scores[0].get("main_score")
            print(f"{task_result.task_name} {split}: main score (nDCG@10) {main:.4f}; results under {args.out}")
    return 0


def add_mteb(sub) -> None:
    """The ``mteb`` subcommand of ``lexgraph`` (``sub``: its subparsers)."""
    from lexgraph.systems.mteb_adapter import WORKSPACE_TASK

    p = add_command(
        sub,
        "mteb",
        cmd_mteb,
        "evaluate a dense system with MTEB 2 (the workspace's split, or an MTEB task)",
        "Run mteb.evaluate on a dense system of the workspace (both sides its own encoders) and write "
        "the results in MTEB's format under OUT.",
    )
    p.add_argument("out", metavar="OUT", help="the results folder (MTEB's ResultCache layout)")
    dense_system_option(p)
    p.add_argument(
        "--task",
        default=WORKSPACE_TASK,
        help=f"'{WORKSPACE_TASK}' (the workspace's labelled split, offline) or an MTEB task name such as "
        "BSARDRetrieval.v2 (default: %(default)s)",
    )
    p.add_argument("--split", default="test", help="the workspace task's split (default: %(default)s)")
    workspace_option(p, "the lexgraph workspace")
    device_option(p, "cpu", "cpu, cuda or auto")
