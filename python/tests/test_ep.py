"""ptxforge.ep.Buffer (DeepEP-style dispatch/combine over emulated ranks) against a numpy
routing reference: every token reaches exactly its top-k experts' ranks with its own bytes,
combine is the weighted sum of the expert outputs, and the handle drives the backward passes.
"""

import numpy as np
import pytest

import ptxforge.ep as ep
import ptxforge.kernels as K

RANKS, GPN, HIDDEN, EXPERTS, TOPK = 4, 2, 256, 8, 3
EPR = EXPERTS // RANKS


def bf16_round(x):
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


@pytest.fixture(scope="module")
def buf():
    # two nodes of two ranks: both the inter-node and the intra-node paths run
    return ep.Buffer(
        num_ranks=RANKS, hidden=HIDDEN, num_experts=EXPERTS, gpus_per_node=GPN,
        num_sms=4, max_tokens_per_rank=32, devices=[f"emu:{40 + r}" for r in range(RANKS)],
    )


def routing(r, tokens):
    """Per rank: random distinct experts per token (some slots -1), weights, inputs."""
    idx, w, x = [], [], []
    for t in tokens:
        ids = np.stack([r.permutation(EXPERTS)[:TOPK] for _ in range(t)]) if t else np.zeros((0, TOPK))
        ids = ids.astype(np.int64)
        if t:
            ids[r.random(ids.shape) < 0.15] = -1
        idx.append(ids)
        w.append(r.uniform(0.1, 1.0, size=(t, TOPK)).astype(np.float32))
        x.append(r.standard_normal((t, HIDDEN)).astype(np.float32))
    return idx, w, x


def expected_rows(idx, d):
    """(source rank, token, slot, global expert) of every copy destination rank d receives."""
    rows = set()
    for s, ids in enumerate(idx):
        for t, row in enumerate(ids):
            for k, e in enumerate(row):
                if e >= 0 and e // EPR == d:
                    rows.add((s, t, k, int(e)))
    return rows


def check_layout(recv_expert, counts, d, want):
    """Rows grouped by local expert, segments padded to 128, counts as routed."""
    rows = len(recv_expert)
    assert rows % 128 == 0
    base = 0
    for le in range(EPR):
        n = sum(1 for (_, _, _, e) in want if e == d * EPR + le)
        assert counts[le] == n
        assert np.all(recv_expert[base : base + n] == le)
        pad = -(-n // 128) * 128
        assert np.all(recv_expert[base + n : base + pad] == -1)
        base += pad
    assert base == rows


def test_layout_matches_numpy(buf):
    r = np.random.default_rng()
    idx, _, _ = routing(r, [23])
    per_rank, per_node, per_expert, in_rank = buf.get_dispatch_layout(idx[0], rank=1)
    dest = np.zeros((23, RANKS), dtype=bool)
    for t, row in enumerate(idx[0]):
        for e in row[row >= 0]:
            dest[t, e // EPR] = True
    np.testing.assert_array_equal(in_rank, dest)
    np.testing.assert_array_equal(per_rank, dest.sum(0))
    np.testing.assert_array_equal(per_node, dest.reshape(23, -1, GPN).any(2).sum(0))
    np.testing.assert_array_equal(per_expert, np.bincount(idx[0][idx[0] >= 0], minlength=EXPERTS))


def test_dispatch_combine_round_trip(buf):
    r = np.random.default_rng()
    tokens = [17, 0, 32, 9]  # rank 1 sends nothing, rank 2 sends the maximum
    idx, w, x = routing(r, tokens)
    recv_x, recv_expert, recv_w, counts, h = buf.dispatch(x, idx, w)
    src_rank, src_tok, slot = h.recv_src_rank, h.recv_src_token, h.recv_topk_slot
    for d in range(RANKS):
        want = expected_rows(idx, d)
        real = recv_expert[d] >= 0
        got = {
            (int(s), int(t), int(k), d * EPR + int(e))
            for s, t, k, e in zip(src_rank[d][real], src_tok[d][real], slot[d][real], recv_expert[d][real])
        }
        assert got == want and real.sum() == len(want)  # every copy exactly once
        check_layout(recv_expert[d], counts[d], d, want)
        for row in np.nonzero(real)[0]:
            s, t, k = src_rank[d][row], src_tok[d][row], slot[d][row]
            np.testing.assert_array_equal(recv_x[d][row], bf16_round(x[s][t]))
            assert recv_w[d][row] == w[s][t, k]
        assert np.all(recv_x[d][~real] == 0) and np.all(recv_w[d][~real] == 0)
    # the experts' outputs: fresh random rows; combine = sum of w * y over a token's copies
    ys = [r.standard_normal(rx.shape).astype(np.float32) for rx in recv_x]
    out = buf.combine(ys, h, recv_w)
    for s in range(RANKS):
        want = np.zeros((tokens[s], HIDDEN))
        mag = np.zeros((tokens[s], HIDDEN))
        for d in range(RANKS):
            for row in np.nonzero((recv_expert[d] >= 0) & (src_rank[d] == s))[0]:
                term = recv_w[d][row] * bf16_round(ys[d][row])
                want[src_tok[d][row]] += term
                mag[src_tok[d][row]] += np.abs(term)
        assert out[s].shape == (tokens[s], HIDDEN)
        # BF16 on the links: one rounding (unit 2^-8) at the sender, forwarder and home
        assert np.all(np.abs(out[s] - want) <= 3 * 2.0**-8 * mag * 1.001)


def test_backward_uses_the_handle(buf):
    r = np.random.default_rng()
    tokens = [5, 11, 3, 20]
    idx, w, x = routing(r, tokens)
    recv_x, recv_expert, _, _, h = buf.dispatch(x, idx, w)
    # backward of combine: gradients of the combined tokens go back to the rows (cached dispatch)
    g = [r.standard_normal((t, HIDDEN)).astype(np.float32) for t in tokens]
    gx, gexp, _, _, h2 = buf.dispatch(g, handle=h)
    assert h2 is h
    for d in range(RANKS):
        np.testing.assert_array_equal(gexp[d], recv_expert[d])
        real = np.nonzero(recv_expert[d] >= 0)[0]
        want = np.array([bf16_round(g[s][t]) for s, t in zip(h.recv_src_rank[d][real], h.recv_src_token[d][real])])
        np.testing.assert_array_equal(gx[d][real], want.reshape(len(real), HIDDEN))
    # backward of dispatch: an unweighted combine sums the rows' gradients per token
    gy = [r.standard_normal(rx.shape).astype(np.float32) for rx in recv_x]
    out = buf.combine(gy, h)
    for s in range(RANKS):
        want = np.zeros((tokens[s], HIDDEN))
        mag = np.zeros((tokens[s], HIDDEN))
        for d in range(RANKS):
            for row in np.nonzero((recv_expert[d] >= 0) & (h.recv_src_rank[d] == s))[0]:
                want[h.recv_src_token[d][row]] += bf16_round(gy[d][row])
                mag[h.recv_src_token[d][row]] += np.abs(bf16_round(gy[d][row]))
        assert np.all(np.abs(out[s] - want) <= 3 * 2.0**-8 * mag * 1.001)


def test_fp8_payload(buf):
    r = np.random.default_rng()
    tokens = [6, 13, 0, 8]
    idx, w, x = routing(r, tokens)
    xq = [K.quantize_fp8(xi, ue8m0=False) if len(xi) else (np.zeros((0, HIDDEN), np.uint8), np.zeros((0, 2), np.float32)) for xi in x]
    recv_x, recv_expert, _, counts, h = buf.dispatch(xq, idx, w)
    for d in range(RANKS):
        q, s = recv_x[d]
        assert q.dtype == np.uint8 and s.shape == (len(recv_expert[d]), HIDDEN // 128)
        real = np.nonzero(recv_expert[d] >= 0)[0]
        assert len(real) == len(expected_rows(idx, d))
        for row in real:
            sr, t = h.recv_src_rank[d][row], h.recv_src_token[d][row]
            np.testing.assert_array_equal(q[row], xq[sr][0][t])
            np.testing.assert_array_equal(s[row], xq[sr][1][t])


def raises(exc, name, fn, *args, **kw):
    with pytest.raises(exc) as e:
        fn(*args, **kw)
    assert str(e.value).startswith(name), str(e.value)


def test_bad_input_names_the_argument(buf):
    r = np.random.default_rng()
    idx, w, x = routing(r, [4, 4, 4, 4])
    raises(ValueError, "x", buf.dispatch, x[:3], idx, w)
    raises(ValueError, "topk_idx", buf.dispatch, x, idx[:3], w)
    bad = [i.copy() for i in idx]
    bad[1][2, 0] = EXPERTS
    raises(ValueError, "topk_idx[1]", buf.dispatch, x, bad, w)
    raises(ValueError, "topk_idx", buf.get_dispatch_layout, bad[1])
    dup = [i.copy() for i in idx]
    dup[0][0] = [1, 1, 2]
    raises(ValueError, "topk_idx[0]", buf.dispatch, x, dup, w)
    raises(TypeError, "topk_idx[0]", buf.dispatch, x, [i.astype(np.float32) for i in idx], w)
    raises(TypeError, "x[2]", buf.dispatch, x[:2] + [x[2].astype(np.int32)] + x[3:], idx, w)
    raises(ValueError, "x[0]", buf.dispatch, [x[0][:, :128]] + x[1:], idx, w)
    raises(ValueError, "topk_weights[3]", buf.dispatch, x, idx, w[:3] + [w[3][:, :2]])
    big = [r.standard_normal((33, HIDDEN)).astype(np.float32)] + x[1:]
    raises(ValueError, "x[0]", buf.dispatch, big, [np.zeros((33, TOPK), np.int64)] + idx[1:], [np.ones((33, TOPK), np.float32)] + w[1:])
    raises(ValueError, "rank", buf.get_dispatch_layout, idx[0], rank=RANKS)
    _, _, _, _, h = buf.dispatch(x, idx, w)
    other = ep.Buffer(num_ranks=RANKS, hidden=HIDDEN, num_experts=EXPERTS, num_sms=2, devices=[f"emu:{50 + i}" for i in range(RANKS)])
    rows = [np.zeros((n, HIDDEN), np.float32) for n in h.num_recv_rows]
    raises(ValueError, "handle", other.combine, rows, h)
    raises(ValueError, "x[1]", buf.combine, rows[:1] + [rows[1][:1]] + rows[2:], h)
    raises(ValueError, "topk_weights[0]", buf.combine, rows, h, [np.ones(3, np.float32)] * RANKS)
    raises(ValueError, "topk_idx", buf.dispatch, x, idx, w, handle=h)
    for kw, name in [
        (dict(num_sms=3), "num_sms"),
        (dict(hidden=100), "hidden"),
        (dict(num_experts=6), "num_experts"),
        (dict(gpus_per_node=3), "gpus_per_node"),
        (dict(num_ranks=0), "num_ranks"),
        (dict(devices=["emu:0"]), "devices"),
        (dict(devices=["emu:0"] * 4), "devices"),
        (dict(devices=["gpu:0", "emu:1", "emu:2", "emu:3"]), "devices"),
    ]:
        args = dict(num_ranks=RANKS, hidden=HIDDEN, num_experts=EXPERTS)
        args.update(kw)
        raises(ValueError, name, ep.Buffer, **args)
