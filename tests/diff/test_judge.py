"""The judge on random outputs whose elements are not independent draws (diff/judge.py): judged against the spread
of the reference's own draws on other streams, so a right target passes and a wrong distribution does not."""

from __future__ import annotations

import torch

from conformance.outcome import Status
from diff.judge import Judge

torch.manual_seed(0)
VALUES = torch.randn(8, 512)
WEIGHTS = torch.softmax(torch.randn(64, 8), -1)


def _attend(seed: int, rescale: bool = True) -> torch.Tensor:
    """Attention with dropout over 8 keys: one draw per (row, key), shared by the row's 512 outputs."""
    keep = (torch.rand(64, 8, generator=torch.Generator().manual_seed(seed)) >= 0.5).float()
    return (WEIGHTS * keep * (2.0 if rescale else 1.0)) @ VALUES


def test_outputs_that_share_draws_are_judged_by_the_spread_of_the_references_own_draws():
    reference, others = _attend(0), [_attend(k) for k in range(1, 5)]
    judge = Judge(rule="distribution")
    target = _attend(7)  # a right target on a stream of its own
    plain = judge(target, reference)
    assert plain.status is Status.MISMATCH, "the test that takes all 32,768 elements for independent draws fails it"
    verdict = judge(target, reference, draws=lambda: others)
    assert verdict.status is Status.PASS, verdict.message
    assert verdict.comparison.passed_by["reference draws"] == 1 and "other streams" in verdict.notes[0]

    wrong = judge(_attend(7, rescale=False), reference, draws=lambda: others)  # dropout that forgets 1 / (1 - p)
    assert wrong.status is Status.MISMATCH
    assert "beyond 3x the largest KS distance between the reference and its own draws" in wrong.message
    same = judge(target, reference, draws=lambda: [reference] * 4)  # draws that do not move: no band
    assert same.status is Status.MISMATCH


def test_the_reference_runs_again_on_other_streams_through_opinfos_reseeding():
    from op_tests.draws import other_stream
    from torch.testing._utils import wrapper_set_seed

    q = torch.linspace(-1, 1, 2 * 3 * 16).reshape(2, 3, 16)

    def run():
        return wrapper_set_seed(torch.nn.functional.scaled_dot_product_attention, q, q, q, dropout_p=0.5)

    own = run()
    with other_stream(1):
        one = run()
    with other_stream(2):
        two = run()
    assert torch.equal(run(), own), "the reference's own stream is left as it was"
    assert not torch.equal(one, own) and not torch.equal(two, one)
