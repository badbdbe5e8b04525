"""lexgraph.core.timing: the benchmarks' variants in turns, and their rates against a base."""

from __future__ import annotations

from lexgraph.core import timing


def test_variants_run_in_rotated_turns_and_keep_their_last_output():
    order: list[str] = []
    calls = {"a": 0, "b": 0, "c": 0}

    def variant(name):
        def run():
            order.append(name)
            calls[name] += 1
            return (name, calls[name])

        return run

    seconds, out = timing.interleaved({n: variant(n) for n in "abc"}, repeat=3)
    assert order == list("abcbcacab")
    assert out == {"a": ("a", 3), "b": ("b", 3), "c": ("c", 3)}
    assert all(len(s) == 3 and all(x >= 0 for x in s) for s in seconds.values())


def test_rate_rows_are_items_over_the_median_round_against_the_base():
    rows = timing.rate_rows({"base": [2.0, 4.0, 3.0], "fast": [1.0, 1.5, 9.0]}, items=30, base="base")
    assert rows["base"] == {"articles_per_s": 10.0, "ratio": 1.0, "seconds": [2.0, 4.0, 3.0]}
    assert rows["fast"] == {"articles_per_s": 20.0, "ratio": 2.0, "seconds": [1.0, 1.5, 9.0]}
