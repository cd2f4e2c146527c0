"""linrope.base.memory.retain_freed_memory: large freed tensors are reused without faulting their pages in again."""

import json
import platform
import subprocess
import sys

import pytest

PROBE = r"""
import json, resource, sys, torch
from linrope.base.memory import retain_freed_memory

def faults_of_a_step(warmup):
    # a loop's step: a 64 MB tensor (above glibc's largest mmap threshold) and a small one, then freed
    for _ in range(warmup + 1):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        big, small = torch.empty(16 << 20), torch.empty(100)
        big.fill_(1.0)
        del big, small
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

plain = faults_of_a_step(warmup=3)
applied = retain_freed_memory()
print(json.dumps({"plain": plain, "applied": applied, "again": retain_freed_memory(),
                  "retained": faults_of_a_step(warmup=10)}))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_memory_is_reused_without_page_faults():
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    r = json.loads(res.stdout.strip().splitlines()[-1])
    pages = (64 << 20) // 4096
    assert r["applied"] is True and r["again"] is True
    assert r["plain"] > pages // 2, r  # without it every 64 MB block is faulted in anew
    assert r["retained"] < pages // 20, r  # with it, after a few steps, the pages are already mapped
