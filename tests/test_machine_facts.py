"""benchmark.machine's record of the machine a result came from."""
from __future__ import annotations

import os

from benchmark.machine import machine_facts, memory_giveback


def test_the_facts_name_how_the_machine_gives_memory_back() -> None:
    facts = machine_facts()
    assert facts["cpus"] == os.cpu_count() and facts["memory_bytes"] > 0
    giveback = memory_giveback()
    assert {k: facts[k] for k in giveback} == giveback
    order = giveback["page_reporting_order"]
    reports = os.path.exists("/sys/module/page_reporting/parameters/page_reporting_order")
    assert (order is not None) == reports and (order is None or 0 <= order <= 20)
    assert all(isinstance(a, str) and a for a in giveback["damon_actions"])
    if not os.path.isdir("/sys/kernel/mm/damon/admin/kdamonds"):
        assert giveback["damon_actions"] == []
