"""What XLA made of a program (plnexp.measure.xla_stats, plnexp.strategies.base): the HLO counts on a module
written by hand, XLA's cost per iteration against hand counts, compile time in three parts.

Hand counts: ``c * 2 + 1`` over N float32 values is 2N flops per step and, as one fused pass, 4N bytes
read + 4N bytes written. XLA adds a few scalar flops and bytes per trip (the loop counter, the
condition): per-iteration figures must match the hand counts within :data:`RTOL` (0.5%; measured on
jax 0.10.2 CPU at N = 4096: +0.02% flops, +0.11% bytes).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest

import plnexp
from plnexp.measure import xla_stats
from plnexp.measure.metrics import PROGRAM
from plnexp.strategies.base import XLA_METRICS, AotResult, aot_compile, peak_bytes, xla_metrics

N = 4096
RTOL = 5e-3
FLOPS, BYTES = 2 * N, 8 * N  # one step of c * 2 + 1 over N float32 values

# A module written by hand: a loop (3 trips) whose body holds another loop (no known trip count);
# one condition serves both loops; a fused computation is called from the entry and the inner body;
# a reduce applies a scalar computation; the entry calls a helper computation.
HLO = """HloModule hand, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%fused_double (p.0: f32[4]) -> f32[4] {
  %p.0 = f32[4]{0} parameter(0)
  %c.0 = f32[] constant(2)
  %b.0 = f32[4]{0} broadcast(%c.0), dimensions={}
  ROOT %m.0 = f32[4]{0} multiply(%p.0, %b.0)
}

%add (x.a: f32[], y.a: f32[]) -> f32[] {
  %x.a = f32[] parameter(0)
  %y.a = f32[] parameter(1)
  ROOT %s.a = f32[] add(%x.a, %y.a)
}

%inner_body (t.0: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t.0 = (s32[], f32[4]{0}) parameter(0)
  %i.0 = s32[] get-tuple-element(%t.0), index=0
  %v.0 = f32[4]{0} get-tuple-element(%t.0), index=1
  %f.0 = f32[4]{0} fusion(%v.0), kind=kLoop, calls=%fused_double, metadata={op_name="jit(f)/mul" stack_frame_id=3}
  ROOT %r.0 = (s32[], f32[4]{0}) tuple(%i.0, %f.0)
}

%cond (t.1: (s32[], f32[4])) -> pred[] {
  %t.1 = (s32[], f32[4]{0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%t.1), index=0
  %n.1 = s32[] constant(3)
  ROOT %lt.1 = pred[] compare(%i.1, %n.1), direction=LT
}

%outer_body (t.2: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t.2 = (s32[], f32[4]{0}) parameter(0)
  %w.inner = (s32[], f32[4]{0}) while(%t.2), condition=%cond, body=%inner_body
  %v.2 = f32[4]{0} get-tuple-element(%w.inner), index=1
  %z.2 = f32[] constant(0)
  %red.2 = f32[] reduce(%v.2, %z.2), dimensions={0}, to_apply=%add
  %i.2 = s32[] get-tuple-element(%w.inner), index=0
  ROOT %r.2 = (s32[], f32[4]{0}) tuple(%i.2, %v.2)
}

%helper (p.4: f32[4]) -> f32[4] {
  %p.4 = f32[4]{0} parameter(0)
  ROOT %n.4 = f32[4]{0} negate(%p.4)
}

ENTRY %main (x.3: f32[4]) -> f32[4] {
  %x.3 = f32[4]{0} parameter(0)
  %zero.3 = s32[] constant(0)
  %tup.3 = (s32[], f32[4]{0}) tuple(%zero.3, %x.3)
  %w.outer = (s32[], f32[4]{0}) while(%tup.3), condition=%cond, body=%outer_body, backend_config={"known_trip_count":{"n":"3"}}
  %f.3 = f32[4]{0} fusion(%x.3), kind=kLoop, calls=%fused_double
  %c.3 = f32[4]{0} call(%f.3), to_apply=%helper
  ROOT %out.3 = f32[4]{0} get-tuple-element(%w.outer), index=1
}
"""


def test_counts_of_a_module_written_by_hand():
    """main 7 + helper 2 + cond 4 (once, for both loops) + outer body 7 + inner body 5 = 25
    instructions; the fused computation and the reduce's scalar add are not counted; 2 fusions."""
    s = xla_stats.stats(HLO)
    assert s.instructions == 25
    assert s.opcodes["negate"] == 1 and s.opcodes["call"] == 1
    assert s.fusions == 2
    assert sum(s.opcodes.values()) == s.instructions
    assert s.opcodes["while"] == 2 and s.opcodes["reduce"] == 1 and s.opcodes["parameter"] == 5
    assert "multiply" not in s.opcodes and "add" not in s.opcodes  # inside a fusion, an applied scalar function
    outer, inner = s.loops
    assert (outer.name, outer.depth, outer.trip_count, outer.body) == ("w.outer", 0, 3, "outer_body")
    assert outer.body_instructions == 7 + 4 + 5  # its body, the condition and the loop inside
    assert (inner.name, inner.depth, inner.trip_count, inner.body_instructions) == ("w.inner", 1, None, 5)


def test_the_loop_cut_out_as_modules_of_its_own():
    loop, (body, cond) = xla_stats.loop_modules(HLO)
    assert loop.name == "w.outer"
    assert "ENTRY %outer_body" in body and "%main" not in body and "%fused_double" in body and "%add" in body
    assert "metadata" not in body and body.count("ENTRY") == 1
    assert "ENTRY %cond" in cond and "%outer_body" not in cond
    assert xla_stats.loop_modules(HLO.replace("while(", "call(").replace("body=", "to_apply=")) is None


def test_functions_are_joined_and_split_back():
    texts = {"loss_and_grad": HLO, "update": HLO.replace("hand", "other")}
    joined = xla_stats.join_functions(texts)
    assert joined.count(xla_stats.FUNCTION_HEADER) == 2
    assert {k: v.strip() for k, v in xla_stats.split_functions(joined).items()} == {
        k: v.strip() for k, v in texts.items()
    }
    assert xla_stats.join_functions({"fit": HLO}) == HLO and xla_stats.split_functions(HLO) == {"": HLO}
    assert sum(xla_stats.stats(t).instructions for t in xla_stats.split_functions(joined).values()) == 2 * 25
    with pytest.raises(ValueError, match="no ENTRY"):
        xla_stats.stats("not HLO at all")


def _scan(length: int, unroll: int = 1):
    def f(x):
        return jax.lax.scan(lambda c, _: (c * 2.0 + 1.0, None), x, None, length=length, unroll=unroll)[0]

    return jax.jit(f)


def _per_iter(aot: AotResult) -> dict:
    return aot.per_iteration()


X = jnp.ones(N, jnp.float32)


@pytest.mark.parametrize("length", [10, 100])
def test_a_loop_body_is_costed_once_per_program_and_per_iteration_matches_the_hand_count(length):
    aot = aot_compile(_scan(length), X)
    # XLA's own cost counts the body once whatever the trip count, plus the copy of x into the loop
    assert aot.cost["flops"] == pytest.approx(FLOPS, rel=RTOL)
    assert aot.cost["bytes accessed"] == pytest.approx(2 * BYTES, rel=RTOL)
    per = _per_iter(aot)
    assert per["counted"].startswith("one trip of loop")
    assert per["flops"] == pytest.approx(FLOPS, rel=RTOL)
    assert per["bytes accessed"] == pytest.approx(BYTES, rel=RTOL)  # the copy outside the loop left out


def test_an_unrolled_body_holds_its_steps_and_fuses_them():
    """unroll=4 over 16 steps: 4 trips of a body holding 4 steps. XLA's whole cost has 4 steps' flops;
    per iteration, the flops of one step, and a quarter of one step's bytes: XLA fuses the 4 steps
    into one pass over x."""
    aot = aot_compile(_scan(16, unroll=4), X)
    assert aot.cost["flops"] == pytest.approx(4 * FLOPS, rel=RTOL)
    (loop,) = xla_stats.stats(aot.hlo).loops
    assert loop.trip_count == 4
    per = _per_iter(aot)
    assert per["counted"].endswith("/ 4 step(s) per trip")
    assert per["flops"] == pytest.approx(FLOPS, rel=RTOL)
    assert per["bytes accessed"] == pytest.approx(BYTES / 4, rel=RTOL)


def test_a_remainder_is_peeled_and_a_fully_unrolled_scan_has_no_loop():
    peeled = aot_compile(_scan(18, unroll=4), X)  # 4 trips of 4 steps, 2 steps after the loop
    assert xla_stats.stats(peeled.hlo).loops[0].trip_count == 4
    assert _per_iter(peeled)["flops"] == pytest.approx(FLOPS, rel=RTOL)
    whole = aot_compile(_scan(4, unroll=4), X)
    assert xla_stats.stats(whole.hlo).loops == ()
    per = _per_iter(whole)
    assert per["counted"] == "no loop left: the whole program / 4"
    assert per["flops"] == pytest.approx(FLOPS, rel=RTOL)
    assert per["bytes accessed"] == pytest.approx(BYTES / 4, rel=RTOL)


def test_a_while_loop_without_a_known_trip_count():
    def f(x, n):
        return jax.lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 2.0 + 1.0), (0, x))[1]

    aot = aot_compile(jax.jit(f), X, 7)
    (loop,) = xla_stats.stats(aot.hlo).loops
    assert loop.trip_count is None
    assert _per_iter(aot)["flops"] == pytest.approx(FLOPS, rel=RTOL)


def test_a_function_without_a_loop_is_costed_per_call():
    aot = aot_compile(jax.jit(lambda x: x * 2.0 + 1.0), X)
    assert _per_iter(aot)["counted"] == "one call (one per iteration)"
    assert _per_iter(aot)["flops"] == FLOPS and _per_iter(aot)["bytes accessed"] == BYTES


def test_xla_metrics_of_several_functions_sum_counts_and_take_the_largest_peak():
    one, two = aot_compile(_scan(10), X), aot_compile(jax.jit(lambda x: x * 2.0 + 1.0), X)
    m = xla_metrics({"a": one, "b": two})
    assert set(m) == set(XLA_METRICS) == {metric.key for metric in PROGRAM} - {"trace_s", "lower_s", "xla_compile_s"}
    sa, sb = xla_stats.stats(one.hlo), xla_stats.stats(two.hlo)
    assert m["xla_instructions"] == sa.instructions + sb.instructions
    assert m["xla_fusions"] == sa.fusions + sb.fusions
    assert m["xla_flops_per_iter"] == pytest.approx(2 * FLOPS, rel=RTOL)
    mem = one.memory
    assert peak_bytes(mem) == (
        mem["argument_size_in_bytes"]
        + mem["output_size_in_bytes"]
        + mem["temp_size_in_bytes"]
        - mem["alias_size_in_bytes"]
    )
    assert m["peak_bytes"] == max(peak_bytes(one.memory), peak_bytes(two.memory)) >= 2 * 4 * N  # x in, result out


# (eager logs none of these, nor the HLO: tests/test_compare.py; jit_per_function's parts also there)
@pytest.mark.parametrize("strategy", ["scan", pytest.param("jit_per_function", marks=pytest.mark.slow)])
def test_compile_time_in_three_parts_on_oaks(oaks, strategy):
    t = plnexp.fit(oaks, n_iter=5, strategy=strategy, compile_cache=False).timing
    split = t.program
    parts = split.trace_s + split.lower_s + split.xla_compile_s
    assert all(p > 0 for p in (split.trace_s, split.lower_s, split.xla_compile_s))
    assert parts == pytest.approx(t.compile_s, rel=0.1)
    assert split.xla_compile_s > split.lower_s  # XLA's passes dominate a cold compile
    m = t.as_metrics()
    assert {"trace_s", "lower_s", "xla_compile_s", *XLA_METRICS} <= set(m)
    assert all(math.isfinite(v) for v in m.values())
    if strategy == "jit_per_function":
        functions = xla_stats.split_functions(t.program.hlo)
        assert list(functions) == ["loss_and_grad", "update", "complete"]
        assert m["xla_instructions"] == sum(xla_stats.stats(h).instructions for h in functions.values())
    else:
        assert xla_stats.stats(t.program.hlo).loops[0].trip_count == 5
