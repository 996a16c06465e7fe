"""Bad input raises TypeError/ValueError naming the parameter (with the messages of
`ptxforge run`); emulator faults and hangs raise EmulatorFault/EmulatorHang carrying the
diagnostic; Ctrl-C interrupts a launch."""

import os
import signal
import threading
import time
import _thread

import numpy as np
import pytest

import ptxforge as pf
from conftest import AXPB_I64, OOB, OOB_LINE, REDUCE, REVERSE_DYN, SPIN, VADD


@pytest.fixture
def vadd(rng):
    n = 64
    a, b = rng.standard_normal((2, n)).astype(np.float32)
    c = np.full(n, np.nan, np.float32)
    return pf.Module(VADD), a, b, c, n


def launch_error(m, entry, args, exc):
    with pytest.raises(exc) as e:
        m.launch(entry, 1, 64, args)
    return e.value


def test_too_few_and_too_many_arguments(vadd):
    m, a, b, c, n = vadd
    e = launch_error(m, "vadd", [a, b, c], ValueError)
    assert str(e) == "kernel `vadd`: 3 arguments given, kernel takes 4"
    e = launch_error(m, "vadd", [a, b, c, n, n], ValueError)
    assert "5 arguments given, kernel takes 4" in str(e)
    assert np.isnan(c).all()


@pytest.mark.parametrize("value", [-1, 2**32, 2**200])
def test_integer_out_of_range(vadd, value):
    m, a, b, c, _ = vadd
    e = launch_error(m, "vadd", [a, b, c, value], ValueError)
    assert e.param == "n" and e.index == 3
    assert "argument 3 (`n`)" in str(e) and "out of range for .u32" in str(e)


def test_signed_range(rng):
    x = np.zeros(4, np.int64)
    e = launch_error(pf.Module(AXPB_I64), "axpb", [x, x, 1, 2**31, 4], ValueError)
    assert e.param == "off" and "out of range for .s32" in str(e)


def test_float_for_an_integer_and_int_for_a_float(vadd):
    m, a, b, c, _ = vadd
    e = launch_error(m, "vadd", [a, b, c, 64.0], TypeError)
    assert str(e) == (
        "kernel `vadd`: argument 3 (`n`): float 64.0 given, parameter is .u32 (an integer)"
    )
    x = np.zeros((1, 256), np.float32)
    e = launch_error(pf.Module(REDUCE), "rowsum", [x, x, 2], TypeError)
    assert e.param == "scale" and "parameter is .f32 (a float)" in str(e)


def test_numpy_scalars_must_be_exactly_the_parameter_kind(vadd):
    m, a, b, c, _ = vadd
    e = launch_error(m, "vadd", [a, b, c, np.int32(64)], TypeError)
    assert "argument 3 (`n`): i32 given, parameter is .u32 (no implicit conversion" in str(e)
    # the right kind passes
    m.launch("vadd", 1, 64, [a, b, c, np.uint32(64)])
    np.testing.assert_allclose(c, a.astype(np.float64) + b, rtol=2**-23)


def test_unsupported_dtype(vadd):
    m, a, b, c, n = vadd
    e = launch_error(m, "vadd", [a.astype(np.complex64), b, c, n], TypeError)
    assert e.param == "a" and "dtype complex64" in str(e)


def test_an_array_for_a_scalar_parameter(vadd):
    m, a, b, c, _ = vadd
    e = launch_error(m, "vadd", [a, b, c, np.zeros((2, 2), np.uint32)], TypeError)
    assert e.param == "n" and "shape [2, 2]" in str(e)


def test_a_scalar_for_a_pointer_parameter_is_a_size_error(vadd):
    m, a, b, c, n = vadd
    e = launch_error(m, "vadd", [a, b, np.float32(1.0), n], TypeError)
    assert e.param == "c"


def test_non_contiguous_arrays_are_refused(vadd):
    m, a, b, _, n = vadd
    c2 = np.full(2 * n, np.nan, np.float32)
    e = launch_error(m, "vadd", [a, b, c2[::2], n], ValueError)
    assert e.param == "c" and "non-contiguous" in str(e) and "ascontiguousarray" in str(e)
    assert np.isnan(c2).all()


def test_a_device_array_on_another_device(vadd):
    m, a, b, _, n = vadd
    c = pf.Device("emu:1").array(np.zeros(n, np.float32))
    e = launch_error(m, "vadd", [a, b, c, n], ValueError)
    assert e.param == "c" and "on emu:1" in str(e) and "loaded on emu:0" in str(e)


def test_unsupported_argument_types(vadd):
    m, a, b, _, n = vadd
    e = launch_error(m, "vadd", [a, b, [1.0, 2.0], n], TypeError)
    assert e.param == "c" and "list" in str(e)
    with pytest.raises(TypeError, match="args"):
        m.launch("vadd", 1, 64, 5)


def test_copy_from_checks_the_shape(rng):
    d = pf.asarray(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"x: shape \[3, 2\] given"):
        d.copy_from(np.zeros((3, 2), np.float32))
    x = rng.standard_normal((2, 3))
    d.copy_from(x)
    np.testing.assert_array_equal(d.numpy(), x.astype(np.float32))


def test_bad_entry_grid_block_and_options(vadd):
    m, a, b, c, n = vadd
    with pytest.raises(ValueError, match="entry: no kernel `vad` in the module .kernels: vadd."):
        m.launch("vad", 1, 64, [a, b, c, n])
    with pytest.raises(ValueError, match="grid"):
        m.launch("vadd", 0, 64, [a, b, c, n])
    with pytest.raises(ValueError, match="block"):
        m.launch("vadd", 1, (1, 2, 3, 4), [a, b, c, n])
    with pytest.raises(ValueError):
        m.launch("vadd", 1, 2048, [a, b, c, n])
    with pytest.raises(TypeError, match="unexpected keyword argument 'sharde'"):
        m.launch("vadd", 1, 64, [a, b, c, n], sharde=4)
    with pytest.raises(ValueError, match="timeout"):
        m.launch("vadd", 1, 64, [a, b, c, n], timeout=-1)
    with pytest.raises(ValueError, match="stream"):
        m.launch("vadd", 1, 64, [a, b, c, n], stream=pf.Device("emu:1").stream())
    with pytest.raises(ValueError, match="entry"):
        m.params("nothing")
    assert np.isnan(c).all()


def test_unparsable_and_invalid_ptx():
    with pytest.raises(pf.PtxError) as e:
        pf.Module(VADD.replace("add.f32 %f3, %f1, %f2;", "add.f32 %f3, %f1 %f2;"))
    assert isinstance(e.value, ValueError)
    assert e.value.line == VADD.splitlines().index("  add.f32 %f3, %f1, %f2;") + 1
    # parses, but the validator refuses it (as `ptxforge run` does): an undeclared register
    with pytest.raises(pf.PtxError, match="does not validate"):
        pf.Module(VADD.replace("add.f32 %f3, %f1, %f2;", "add.f32 %f3, %f1, %f9;"))
    with pytest.raises(ValueError, match="neither PTX text"):
        pf.Module("no/such/file.ptx")
    with pytest.raises(ValueError, match="spec"):
        pf.Device("tpu:0")


def test_an_out_of_bounds_store_carries_the_ptx_line_and_address():
    a = pf.asarray(np.zeros(4, np.float32))
    with pytest.raises(pf.EmulatorFault) as e:
        pf.Module(OOB).launch("oob", 1, 1, [a])
    f = e.value
    assert isinstance(f, RuntimeError) and not isinstance(f, pf.EmulatorHang)
    assert f.kernel == "oob" and f.cta == (0, 0, 0) and f.thread == (0, 0, 0)
    assert f.line == OOB_LINE and f.kind == "out_of_bounds" and f.space == "global"
    assert f.address == a.ptr + 1048576
    assert f.instruction.startswith("st.global.f32")
    assert f"PTX line {OOB_LINE}" in str(f) and hex(f.address) in str(f)


def test_a_launch_without_its_dynamic_shared_memory_says_so(rng):
    x = rng.standard_normal(32).astype(np.float32)
    y = np.full(32, np.nan, np.float32)
    with pytest.raises(pf.EmulatorFault) as e:
        pf.Module(REVERSE_DYN).launch("reverse", 1, 32, [x, y])
    assert e.value.kind == "out_of_bounds" and e.value.space == "shared"
    assert "`extern .shared` dyn" in str(e.value) and "shared=" in str(e.value)
    assert np.isnan(y).all()


def test_a_hang_raises_emulator_hang():
    t = time.monotonic()
    with pytest.raises(pf.EmulatorHang) as e:
        pf.Module(SPIN).launch("spin", 1, 32, [pf.asarray(np.zeros(1))], timeout=0.3)
    assert time.monotonic() - t < 10
    assert isinstance(e.value, pf.EmulatorFault) and e.value.kernel == "spin"
    assert e.value.kind == "hang" and e.value.line > 0


@pytest.mark.parametrize("how", ["interrupt_main", "SIGINT"])
def test_ctrl_c_interrupts_a_launch(rng, how):
    def fire():
        if how == "SIGINT":
            os.kill(os.getpid(), signal.SIGINT)
        else:
            _thread.interrupt_main()

    m = pf.Module(SPIN)
    timer = threading.Timer(0.3, fire)
    t = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        m.launch("spin", 4, 64, [pf.asarray(np.zeros(1))], timeout=120)
    assert time.monotonic() - t < 5
    timer.join()
    # the emulator is usable afterwards
    n = 64
    a, b = rng.standard_normal((2, n)).astype(np.float32)
    c = np.full(n, np.nan, np.float32)
    pf.Module(VADD).launch("vadd", 1, 64, [a, b, c, n])
    np.testing.assert_allclose(c, a.astype(np.float64) + b, rtol=2**-23)


ODD = [None, object(), {"a": 1}, "7", b"7", 1j, float("nan"), float("inf"), 2**64, -(2**63) - 1,
       np.array(["x"]), np.zeros(3, dtype=object), np.datetime64("2020-01-01"), True]


@pytest.mark.parametrize("value", ODD, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("slot", [0, 3])
def test_odd_arguments_raise_type_or_value_errors(vadd, value, slot):
    """Anything in any position: a TypeError/ValueError naming the parameter, or (for values
    a parameter can take) a launch; never another exception or a crash."""
    m, a, b, c, n = vadd
    args = [a, b, c, n]
    args[slot] = value
    try:
        m.launch("vadd", 1, 64, args)
    except (TypeError, ValueError) as e:
        assert e.param == ["a", "n"][slot // 3], str(e)
    except pf.EmulatorFault as f:
        # a bool is an int: True for the .u64 `a` is the address 1, which the kernel reads
        assert value is True and slot == 0 and f.address == 1 and f.kind == "misaligned"
    else:
        # True for the .u32 `n` is 1
        assert value is True and slot == 3
