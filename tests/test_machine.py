"""lexgraph.core.machine: the machine a benchmark's record names."""

from __future__ import annotations

import os

from lexgraph.core.machine import cpu_model, describe


def test_describe_names_the_cores_the_cpu_model_and_the_threads_given():
    assert describe() == f"{os.cpu_count()} cores, {cpu_model()}"
    assert describe(3) == f"{os.cpu_count()} cores, {cpu_model()}; torch threads: 3"
    assert cpu_model() and "\n" not in cpu_model()
