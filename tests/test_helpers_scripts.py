"""The in-process script runner leaves the process as it found it: a script that configures
logging (``basicConfig``, a library's logger quieted) must not change what a later test sees."""

from __future__ import annotations

import logging

from helpers_scripts import run_script


def test_a_script_s_logging_configuration_does_not_outlive_it(tmp_path):
    script = tmp_path / "quiet.py"
    script.write_text(
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "logging.getLogger('transformers').setLevel(logging.ERROR)\n"
        "logging.getLogger('made.by.script').propagate = False\n"
        "sys.exit(3)\n",
        encoding="utf-8",
    )
    library = logging.getLogger("transformers")
    library.setLevel(logging.WARNING)
    root_handlers, root_level = list(logging.root.handlers), logging.root.level
    assert run_script(script) == 3
    assert library.level == logging.WARNING
    assert logging.root.handlers == root_handlers and logging.root.level == root_level
    assert logging.getLogger("made.by.script").propagate
