"""The GPU step's attention variants and the host-speed scaling, on the CPU (no GPU needed)."""

import pytest
import torch

from lab.gpu_step import attend
from lab.host_speed import scaled


@pytest.mark.parametrize("fed", [1, 2, 5])
def test_packed_attention_equals_grouped_query_attention(fed):
    generator = torch.Generator().manual_seed(fed)
    q = torch.randn(3, 8, fed, 16, generator=generator)  # 8 query heads over 2 KV heads
    keys, values = (torch.randn(3, 2, 20 + fed, 16, generator=generator) for _ in range(2))
    grouped = attend(q, keys, values, "gqa")
    assert torch.allclose(attend(q, keys, values, "packed"), grouped, atol=1e-5)
    # each query head reads its own KV head: heads 0-3 read KV head 0, 4-7 KV head 1
    alone = torch.nn.functional.scaled_dot_product_attention(q[:, 4:5], keys[:, 1:2], values[:, 1:2])
    assert torch.allclose(grouped[:, 4:5], alone, atol=1e-5)


def test_host_time_scales_by_the_ratio_of_the_two_hosts_speeds():
    host_step = {"median": [{"batch": 16, "host_ms_per_step": 5.0}, {"batch": 256, "host_ms_per_step": 30.0}]}
    base = {"rows": [{"batch": 16, "us_per_step": 20.0}, {"batch": 256, "us_per_step": 200.0}]}
    here = {"rows": [{"batch": 16, "us_per_step": 10.0}, {"batch": 256, "us_per_step": 150.0}]}
    report = scaled(host_step, base, here)
    assert [row["host_ms_per_step"] for row in report["median"]] == [2.5, 22.5]
    assert [row["scaled_from_ms"] for row in report["median"]] == [5.0, 30.0]
    assert report["scaled_by"] == "jobs.benchmark host-speed"
