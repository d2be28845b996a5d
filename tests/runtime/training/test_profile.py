"""The profile the block planner reads: per-parameter gradient ready times and per-layer forward times."""

from __future__ import annotations

import pytest

from topocc.runtime.training import profile_model

torch = pytest.importorskip("torch")


def test_profile_sees_backward_in_reverse_layer_order() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                              torch.nn.ReLU(), torch.nn.Linear(256, 4))
    prof = profile_model(net, torch.nn.functional.mse_loss, (torch.randn(32, 64), torch.randn(32, 4)), repeats=3)
    assert prof.layers == ("0", "2", "4")
    assert [p.layer for p in prof.params] == [0, 0, 1, 1, 2, 2]
    assert [p.nbytes for p in prof.params] == [64 * 256 * 4, 256 * 4, 256 * 256 * 4, 256 * 4, 256 * 4 * 4, 16]
    weights = [prof.params[i].ready_time_s for i in (0, 2, 4)]
    assert weights[0] > weights[1] > weights[2] > 0                # the last layer's gradient comes first
    assert prof.backward_time_s >= max(p.ready_time_s for p in prof.params)
    assert len(prof.forward_time_s) == 3 and all(t > 0 for t in prof.forward_time_s)
    assert all(p.grad is None for p in net.parameters())


def test_a_module_with_weights_of_its_own_owns_its_childrens() -> None:
    """nn.MultiheadAttention applies out_proj's weight itself (out_proj's forward never runs): one layer."""
    from topocc.runtime.training.profile import owners

    attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    net = torch.nn.ModuleDict({"attn": attn, "ff": torch.nn.Sequential(torch.nn.Linear(16, 16))})
    names, modules, layer_of = owners(net)
    assert names == ["attn", "ff.0"] and modules == [attn, net["ff"][0]]
    assert layer_of == [0, 0, 0, 0, 1, 1]  # in_proj weight and bias, out_proj weight and bias; the linear
    ran: list[str] = []
    for name, m in zip(names, modules):
        m.register_forward_pre_hook(lambda *_, name=name: ran.append(name))
    x = torch.randn(2, 3, 16)
    net["ff"](attn(x, x, x)[0])
    assert ran == names  # every layer's pre-forward hook fires: its update can be gated there
