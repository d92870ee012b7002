"""Explicit SIMD building blocks for the Numba kernels, written as Numba intrinsics.

Numba's loops vectorise well only when LLVM can prove that an index is non-negative and that
the arrays do not overlap; a GEMM micro-kernel also needs its accumulators to stay in vector
registers for a whole pass over the inner dimension, which no loop written in Python gets from
LLVM. The functions here emit the vector code themselves (LLVM IR through Numba's
``@intrinsic``): ``<W x float>`` values, ``llvm.fma``, and masked loads and stores for the ragged
ends of short rows. They compile for any CPU: ``W`` is 16 (one AVX-512 register) where the host
has AVX-512 and 8 elsewhere, and LLVM splits wider vectors into what the target has.

Every function takes 1-D float32 arrays and element offsets; none checks bounds (the callers'
geometry guarantees them; the tests compare every caller with the NumPy reference kernels).

* :func:`microkernel` ``(rows, vectors, a_indirect, b_indirect)``: the GEMM micro-kernel, a
  ``rows x (vectors * W)`` tile of C accumulated in registers over the inner dimension, with
  A's rows and B's rows either ``lda``/``ldb`` apart or found through a table of offsets.
* :func:`copy` ``(dst, d0, src, s0, n)``, :func:`fill` ``(dst, d0, n, value)``,
  :func:`add_into` ``(dst, d0, src, s0, n)`` (``dst += src``), :func:`copy_plus`
  ``(dst, d0, src, s0, n, value)`` (``dst = src + value``), :func:`axpy` ``(dst, d0, src, s0, n,
  value)`` (``dst += value * src``, fused), :func:`mul_add_into` ``(dst, d0, a, a0, b, b0, n)``
  (``dst += a * b``, fused): whole vectors, then one masked vector.
* :func:`total` ``(src, s0, n)``: a float32 sum in a fixed order (lane-wise, then the lanes).
* :func:`pool_window` ``(kind, stride)``: MAX or AVE pooling's window for a row of outputs;
  :func:`window_spread`: AVE pooling's backward for a row of inputs.
* :func:`gather_plus` and :func:`scatter_copy`: strided copies (vector gathers and scatters);
  :func:`deinterleave` and :func:`interleave`: a row's even and odd floats apart and back
  together (stride 2, by shuffles).
* :func:`taps_rows` and :func:`dot_taps_rows`: a depthwise convolution's table of taps over
  rows of outputs, summed in registers; the weight gradient's shifted dot products.
"""
import functools

import llvmlite.binding as llvm
import numpy
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

F32 = ir.FloatType()
I64 = ir.IntType(64)
I32 = ir.IntType(32)


@functools.lru_cache(maxsize=None)
def vector_width():
    """Floats per SIMD register on this host: 16 with AVX-512, else 8."""
    features = llvm.get_host_cpu_features()
    return 16 if features.get("avx512f", False) else 8


def _vt(w):
    return ir.VectorType(F32, w)


def _data(context, builder, arr_type, value):
    return context.make_array(arr_type)(context, builder, value).data


def _splat(builder, value, w):
    vec = builder.insert_element(ir.Constant(_vt(w), ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(vec, ir.Constant(_vt(w), ir.Undefined),
                                  ir.Constant(ir.VectorType(I32, w), [0] * w))


def _vptr(builder, base, offset, w):
    return builder.bitcast(builder.gep(base, [offset]), _vt(w).as_pointer())


def _fma(builder, w):
    return cgutils.get_or_insert_function(builder.module,
                                          ir.FunctionType(_vt(w), [_vt(w)] * 3),
                                          f"llvm.fma.v{w}f32")


def _masked(builder, w):
    """(masked load, masked store) intrinsic declarations for <w x float>."""
    vt, mt = _vt(w), ir.VectorType(ir.IntType(1), w)
    ptr = vt.as_pointer()
    load = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vt, [ptr, I32, mt, vt]), f"llvm.masked.load.v{w}f32.p0")
    store = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [vt, ptr, I32, mt]),
        f"llvm.masked.store.v{w}f32.p0")
    return load, store


def _mask(builder, count, w):
    """<w x i1>: lane i set when i < count (count an i64 in 0..w)."""
    lanes = ir.Constant(ir.VectorType(I64, w), list(range(w)))
    bound = builder.insert_element(ir.Constant(ir.VectorType(I64, w), ir.Undefined), count,
                                   ir.Constant(I32, 0))
    bound = builder.shuffle_vector(bound, ir.Constant(ir.VectorType(I64, w), ir.Undefined),
                                   ir.Constant(ir.VectorType(I32, w), [0] * w))
    return builder.icmp_signed("<", lanes, bound)


def _counted_loop(builder, count, body):
    """Emit ``for i in range(count): body(builder, i)`` (count an i64)."""
    pre = builder.block
    loop = builder.append_basic_block("loop")
    done = builder.append_basic_block("done")
    zero = ir.Constant(I64, 0)
    builder.cbranch(builder.icmp_signed(">", count, zero), loop, done)
    builder.position_at_end(loop)
    i = builder.phi(I64)
    i.add_incoming(zero, pre)
    body(builder, i)
    nxt = builder.add(i, ir.Constant(I64, 1))
    i.add_incoming(nxt, builder.block)
    builder.cbranch(builder.icmp_signed("<", nxt, count), loop, done)
    builder.position_at_end(done)


def _unrolled_rows(builder, rows, rows_at):
    """Emit ``rows_at(builder, first, count)`` over ``rows`` (an i64) in groups of
    :data:`_UNROLL` rows, then the remaining rows one at a time."""
    u = ir.Constant(I64, _UNROLL)
    groups = builder.sdiv(rows, u)
    _counted_loop(builder, groups, lambda b, g: rows_at(b, b.mul(g, u), _UNROLL))
    done = builder.mul(groups, u)
    _counted_loop(builder, builder.sub(rows, done), lambda b, i: rows_at(b, b.add(done, i), 1))


def _vector_op(kind, w):
    """Codegen of the row operations (see the module docstring), ``w`` floats a vector.

    The elements ``[0, n)`` are done as ``n // w`` whole vectors and one masked vector."""
    def codegen(context, builder, signature, args):
        other_p = None
        if kind == "fill":
            dst_t = signature.args[0]
            dst, d0, n, value = args
            src_p = s0 = None
        elif kind == "mul_add_into":
            dst_t, src_t, other_t = signature.args[0], signature.args[2], signature.args[4]
            dst, d0, src, s0, other, o0, n = args
            value = None
            src_p = builder.gep(_data(context, builder, src_t, src), [s0])
            other_p = builder.gep(_data(context, builder, other_t, other), [o0])
        else:
            dst_t, src_t = signature.args[0], signature.args[2]
            dst, d0, src, s0, n = args[:5]
            value = args[5] if kind in ("copy_plus", "axpy") else None
            src_p = builder.gep(_data(context, builder, src_t, src), [s0])
        dst_p = builder.gep(_data(context, builder, dst_t, dst), [d0])
        vt = _vt(w)
        splat = _splat(builder, value, w) if value is not None else None
        mload, mstore = _masked(builder, w)
        fma = _fma(builder, w) if kind in ("axpy", "mul_add_into") else None
        align = ir.Constant(I32, 4)

        def step(builder, off, mask):
            def load(ptr):
                p = _vptr(builder, ptr, off, w)
                if mask is None:
                    return builder.load(p, align=4)
                return builder.call(mload, [p, align, mask, ir.Constant(vt, [0.0] * w)])
            if kind == "fill":
                v = splat
            elif kind == "copy":
                v = load(src_p)
            elif kind == "copy_plus":
                v = builder.fadd(load(src_p), splat)
            elif kind == "axpy":
                v = builder.call(fma, [splat, load(src_p), load(dst_p)])
            elif kind == "mul_add_into":
                v = builder.call(fma, [load(src_p), load(other_p), load(dst_p)])
            else:  # add_into
                v = builder.fadd(load(dst_p), load(src_p))
            p = _vptr(builder, dst_p, off, w)
            if mask is None:
                builder.store(v, p, align=4)
            else:
                builder.call(mstore, [v, p, align, mask])

        wc = ir.Constant(I64, w)
        whole = builder.sdiv(n, wc)
        _counted_loop(builder, whole, lambda b, i: step(b, b.mul(i, wc), None))
        rest = builder.sub(n, builder.mul(whole, wc))
        with builder.if_then(builder.icmp_signed(">", rest, ir.Constant(I64, 0))):
            step(builder, builder.mul(whole, wc), _mask(builder, rest, w))
        return context.get_dummy_value()
    return codegen


def _row_intrinsic(kind):
    w = vector_width()

    if kind == "fill":
        def typer(typingctx, dst, d0, n, value):
            return types.void(dst, types.int64, types.int64, types.float32), _vector_op(kind, w)
    elif kind == "mul_add_into":
        def typer(typingctx, dst, d0, src, s0, other, o0, n):
            return (types.void(dst, types.int64, src, types.int64, other, types.int64,
                               types.int64), _vector_op(kind, w))
    elif kind in ("copy_plus", "axpy"):
        def typer(typingctx, dst, d0, src, s0, n, value):
            return (types.void(dst, types.int64, src, types.int64, types.int64, types.float32),
                    _vector_op(kind, w))
    else:
        def typer(typingctx, dst, d0, src, s0, n):
            return (types.void(dst, types.int64, src, types.int64, types.int64),
                    _vector_op(kind, w))
    typer.__name__ = f"simd_{kind}"
    return intrinsic(typer)


copy = _row_intrinsic("copy")
fill = _row_intrinsic("fill")
add_into = _row_intrinsic("add_into")
copy_plus = _row_intrinsic("copy_plus")
axpy = _row_intrinsic("axpy")
mul_add_into = _row_intrinsic("mul_add_into")


def _total_codegen(w):
    def codegen(context, builder, signature, args):
        src, s0, n = args
        src_p = builder.gep(_data(context, builder, signature.args[0], src), [s0])
        vt = _vt(w)
        mload, _ = _masked(builder, w)
        wc = ir.Constant(I64, w)
        whole = builder.sdiv(n, wc)
        zero = ir.Constant(vt, [0.0] * w)
        acc = cgutils.alloca_once_value(builder, zero)

        def vec(builder, i):
            v = builder.load(_vptr(builder, src_p, builder.mul(i, wc), w), align=4)
            builder.store(builder.fadd(builder.load(acc), v), acc)
        _counted_loop(builder, whole, vec)
        tail_at = builder.mul(whole, wc)
        rest = builder.sub(n, tail_at)
        v = builder.call(mload, [_vptr(builder, src_p, tail_at, w), ir.Constant(I32, 4),
                                 _mask(builder, rest, w), zero])
        lanes = builder.fadd(builder.load(acc), v)
        total = builder.extract_element(lanes, ir.Constant(I32, 0))
        for lane in range(1, w):
            total = builder.fadd(total, builder.extract_element(lanes, ir.Constant(I32, lane)))
        return total
    return codegen


@intrinsic
def total(typingctx, src, s0, n):
    """``sum(src[s0:s0 + n])`` as float32: ``W`` running lane sums, then the lanes in order."""
    return types.float32(src, types.int64, types.int64), _total_codegen(vector_width())


@functools.lru_cache(maxsize=None)
def microkernel(rows, vectors, a_indirect=False, b_indirect=False, a_packed=False, prefetch=0):
    """The GEMM micro-kernel intrinsic for a ``rows x (vectors * vector_width())`` tile.

    ``mk(A, a0, lda, ai, ai0, B, b0, ldb, bi, bi0, C, c0, ldc, k, accumulate)``: the tile
    ``C[c0 + r ldc + j]`` is set to (or, with ``accumulate``, incremented by)
    ``sum_t a_r[t] * b_t[j]`` over ``t < k`` in increasing order (one fused multiply-add per
    term), where row ``r`` of A starts at ``A[a0 + r lda]`` (or ``A[a0 + ai[ai0 + r]]`` when
    ``a_indirect``) and row ``t`` of B at ``B[b0 + t ldb]`` (or ``B[b0 + bi[bi0 + t]]`` when
    ``b_indirect``). With ``a_packed`` A is a packed panel instead: ``a_r[t]`` is
    ``A[a0 + t rows + r]`` (one stream instead of ``rows``; ``lda`` unused). A, B, C are 1-D float32 arrays, ``ai``/``bi`` int64 arrays (ignored unless
    indirect), the rest int64 but ``accumulate`` (bool). The indirect forms read a convolution's
    input in place: a table of the kernel offsets' positions replaces the column matrix.
    ``rows * vectors`` accumulators plus ``vectors`` loads of B must fit the register file
    (32 vector registers with AVX-512). With ``prefetch`` (floats, a constant) each step also
    prefetches the row of B that many floats further on (the next strip's columns; prefetches
    never fault, so past the array's end is harmless). Every form prefetches its tile of C
    before the loop.
    """
    codegen = _microkernel_codegen(vector_width(), rows, vectors, a_indirect, b_indirect,
                                   a_packed, prefetch)

    def typer(typingctx, A, a0, lda, ai, ai0, B, b0, ldb, bi, bi0, C, c0, ldc, k, accumulate):
        i64 = types.int64
        sig = types.void(A, i64, i64, ai, i64, B, i64, i64, bi, i64, C, i64, i64, i64,
                         types.boolean)
        return sig, codegen

    typer.__name__ = (f"microkernel_{rows}x{vectors}" + ("_ai" if a_indirect else "")
                      + ("_bi" if b_indirect else "") + ("_ap" if a_packed else "")
                      + (f"_pf{prefetch}" if prefetch else ""))
    return intrinsic(typer)


def _microkernel_codegen(w, rows, vectors, a_indirect, b_indirect, a_packed, prefetch=0):
    """Codegen of :func:`microkernel`: the operands' row pointers, the loop over the inner
    dimension (:func:`_microkernel_loop`), then the tile of C (:func:`_microkernel_store`)."""
    def codegen(context, builder, signature, args):
        (A_, a0_, lda_, ai_, ai0_, B_, b0_, ldb_, bi_, bi0_, C_, c0_, ldc_, k_,
         acc_) = args
        sa = signature.args
        pa = builder.gep(_data(context, builder, sa[0], A_), [a0_])
        pb = builder.gep(_data(context, builder, sa[5], B_), [b0_])
        pc = builder.gep(_data(context, builder, sa[10], C_), [c0_])
        pai = (builder.gep(_data(context, builder, sa[3], ai_), [ai0_])
               if a_indirect and not a_packed else None)
        a_rows = _microkernel_a_rows(builder, pa, rows, lda_, pai, a_packed)
        pbi = builder.gep(_data(context, builder, sa[8], bi_), [bi0_]) if b_indirect else None
        _prefetch_tile(builder, w, pc, ldc_, rows, vectors)

        def b_row_at(builder, kk):
            if b_indirect:
                return builder.gep(pb, [builder.load(builder.gep(pbi, [kk]))])
            return builder.gep(pb, [builder.mul(kk, ldb_)])
        pre, end, new = _microkernel_loop(builder, w, rows, vectors, k_, a_rows, b_row_at,
                                          a_packed, prefetch)
        _microkernel_store(builder, w, pc, ldc_, acc_, pre, end, new)
        return context.get_dummy_value()
    return codegen


def _prefetch_run(builder, start, offset, floats, write):
    """Prefetch the cache lines of ``floats`` floats from ``start + offset`` (an i64 constant
    offset, in floats) into L1 (``write``: for writing)."""
    pf = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), I32, I32,
                                                        I32]), "llvm.prefetch.p0")
    for off in list(range(0, floats, 16)) + [floats - 1]:
        p = builder.bitcast(builder.gep(start, [ir.Constant(I64, offset + off)]),
                            ir.IntType(8).as_pointer())
        builder.call(pf, [p, ir.Constant(I32, write), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def _prefetch_tile(builder, w, pc, ldc_, rows, vectors):
    """Prefetch the tile of C (``rows`` rows of ``vectors * w`` floats, ``ldc_`` apart) for
    writing, before the loop over the inner dimension: a tile added to a partial sum that has
    left the L2 cache (a weight gradient's dW^T, 9 MB for ResNet-50's 3x3 512-channel layers)
    then arrives while the loop runs instead of after it."""
    for r in range(rows):
        _prefetch_run(builder, builder.gep(pc, [builder.mul(ir.Constant(I64, r), ldc_)]), 0,
                      vectors * w, 1)


def _microkernel_a_rows(builder, pa, rows, lda_, pai, a_packed):
    """Pointers to the first float of each of A's ``rows`` rows: consecutive floats of a packed
    panel, the offsets read from the table ``pai`` (indirect), or ``lda_`` apart."""
    if a_packed:
        return [builder.gep(pa, [ir.Constant(I64, r)]) for r in range(rows)]
    if pai is not None:
        return [builder.gep(pa, [builder.load(builder.gep(pai, [ir.Constant(I64, r)]))])
                for r in range(rows)]
    return [builder.gep(pa, [builder.mul(ir.Constant(I64, r), lda_)]) for r in range(rows)]


def _microkernel_loop(builder, w, rows, vectors, k_, a_rows, b_row_at, a_packed, prefetch=0):
    """``for t < k``: ``vectors`` loads of B's row ``b_row_at(t)``, and per row of A one
    broadcast of ``a_r[t]`` and ``vectors`` fused multiply-adds into the accumulators (phi
    nodes from zero). Leaves the builder after the loop; returns ``(pre, end, new)``: the block
    before the loop, the loop's last block and the accumulators after a pass."""
    vt = _vt(w)
    fma = _fma(builder, w)
    zero = ir.Constant(vt, [0.0] * w)
    pre = builder.block
    loop = builder.append_basic_block("mk_loop")
    done = builder.append_basic_block("mk_done")
    builder.cbranch(builder.icmp_signed(">", k_, ir.Constant(I64, 0)), loop, done)
    builder.position_at_end(loop)
    kk = builder.phi(I64)
    kk.add_incoming(ir.Constant(I64, 0), pre)
    acc = [[builder.phi(vt) for _ in range(vectors)] for _ in range(rows)]
    for row in acc:
        for phi in row:
            phi.add_incoming(zero, pre)
    b_row = b_row_at(builder, kk)
    if prefetch:
        _prefetch_run(builder, b_row, prefetch, vectors * w, 0)
    b = [builder.load(_vptr(builder, b_row, ir.Constant(I64, v * w), w), align=4)
         for v in range(vectors)]
    new = []
    a_step = builder.mul(kk, ir.Constant(I64, rows)) if a_packed else kk
    for r in range(rows):
        a = _splat(builder, builder.load(builder.gep(a_rows[r], [a_step])), w)
        new.append([builder.call(fma, [a, b[v], acc[r][v]]) for v in range(vectors)])
    nxt = builder.add(kk, ir.Constant(I64, 1))
    end = builder.block
    kk.add_incoming(nxt, end)
    for r in range(rows):
        for v in range(vectors):
            acc[r][v].add_incoming(new[r][v], end)
    builder.cbranch(builder.icmp_signed("<", nxt, k_), loop, done)
    builder.position_at_end(done)
    return pre, end, new


def _microkernel_store(builder, w, pc, ldc_, acc_, pre, end, new):
    """The tile's sums (zero when the loop never ran) stored into C's rows, ``ldc_`` apart,
    or added to what C holds when ``acc_`` (accumulate) is set."""
    vt = _vt(w)
    zero = ir.Constant(vt, [0.0] * w)
    rows, vectors = len(new), len(new[0])
    totals = [[builder.phi(vt) for _ in range(vectors)] for _ in range(rows)]
    for r in range(rows):
        for v in range(vectors):
            totals[r][v].add_incoming(zero, pre)
            totals[r][v].add_incoming(new[r][v], end)
    keep = builder.icmp_unsigned("!=", acc_, ir.Constant(acc_.type, 0))
    for r in range(rows):
        c_row = builder.gep(pc, [builder.mul(ir.Constant(I64, r), ldc_)])
        for v in range(vectors):
            total = totals[r][v]
            p = _vptr(builder, c_row, ir.Constant(I64, v * w), w)
            old = builder.load(p, align=4)
            builder.store(builder.select(keep, builder.fadd(old, total), total), p,
                          align=4)


# ------------------------------------------------------------------------------------------------
# Pooling runs: one window offset applied to a row of outputs
# ------------------------------------------------------------------------------------------------
def _int_masked(builder, w):
    it = ir.VectorType(I32, w)
    mt = ir.VectorType(ir.IntType(1), w)
    load = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(it, [it.as_pointer(), I32, mt, it]),
        f"llvm.masked.load.v{w}i32.p0")
    store = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [it, it.as_pointer(), I32, mt]),
        f"llvm.masked.store.v{w}i32.p0")
    return load, store


def _splat_int(builder, value, w):
    it = ir.VectorType(I32, w)
    vec = builder.insert_element(ir.Constant(it, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(vec, ir.Constant(it, ir.Undefined),
                                  ir.Constant(ir.VectorType(I32, w), [0] * w))


def _masked_strided_load(builder, base, start, valid, stride, w, fill):
    """``base[start + stride * lane]`` where ``valid`` (<w x i1>) is set, else ``fill``; stride 1
    or 2 (two masked loads of the floats under the valid lanes, then the even floats)."""
    vt = _vt(w)
    mload, _ = _masked(builder, w)
    align = ir.Constant(I32, 4)
    passthru = ir.Constant(vt, [fill] * w)
    if stride == 1:
        return builder.call(mload, [_vptr(builder, base, start, w), align, valid, passthru])
    undef = ir.Constant(ir.VectorType(ir.IntType(1), w), ir.Undefined)
    halves = []
    for half in range(2):
        # float e of this half is lane (half w + e) // 2's when e is even
        lanes = [(half * w + e) // 2 for e in range(w)]
        spread = builder.shuffle_vector(valid, undef, ir.Constant(ir.VectorType(I32, w), lanes))
        even = ir.Constant(ir.VectorType(ir.IntType(1), w), [e % 2 == 0 for e in range(w)])
        mask = builder.and_(spread, even)
        at = builder.add(start, ir.Constant(I64, half * w))
        halves.append(builder.call(mload, [_vptr(builder, base, at, w), align, mask, passthru]))
    return builder.shuffle_vector(halves[0], halves[1], ir.Constant(
        ir.VectorType(I32, w), [2 * i for i in range(w)]))


@functools.lru_cache(maxsize=None)
def pool_window(kind, stride):
    """A whole window for a row of outputs, in registers, one masked vector of outputs at a
    time; window cells outside the input's columns are left out lane by lane.

    ``kind`` "max": ``run(x, x0, row, rows, cols, col0, width, best, arg, b0, n, index0)`` sets,
    for ``o < n``, ``best[b0 + o]`` to the first maximum (strict ``>`` from ``-FLT_MAX``, NaN
    never wins) of ``x[x0 + r row + j + stride o]`` over ``r < rows``, ``j < cols`` scanned
    row-major, skipping cells whose column ``col0 + j + stride o`` is outside ``[0, width)``, and
    ``arg[b0 + o]`` (int32) to its ``index0 + r row + j + stride o`` (-1 when nothing beat
    ``-FLT_MAX``). ``kind`` "sum": ``run(x, x0, row, rows, cols, col0, width, total, b0, n)``
    sets ``total[b0 + o]`` to the sum of the same cells, added in the same order from 0.
    ``stride`` 1 or 2.
    """
    w = vector_width()
    typer = _pool_max_typer(w, stride) if kind == "max" else _pool_sum_typer(w, stride)
    typer.__name__ = f"pool_window_{kind}_{stride}"
    return intrinsic(typer)


def _pool_chunks(builder, w, stride, px, row_, cols_, col0_, width_, n_, emit):
    """Per vector chunk of outputs: ``emit(builder, at, mask, value_at)``, where
    ``value_at(r, j, fill)`` loads the chunk's window cell (r, j), ``fill`` where the cell's
    column is outside the input or the lane past ``n``."""
    wc = ir.Constant(I64, w)
    steps = builder.sdiv(builder.add(n_, ir.Constant(I64, w - 1)), wc)

    def chunk(builder, i):
        at = builder.mul(i, wc)
        count = builder.sub(n_, at)
        count = builder.select(builder.icmp_signed(">", count, wc), wc, count)
        mask = _mask(builder, count, w)
        first = builder.add(col0_, builder.mul(at, ir.Constant(I64, stride)))
        value_at, value_inside = _pool_cells(w, stride, px, row_, width_, at, first, mask)
        # Masked loads (and, for stride 2, shuffles of their masks) cost several times the
        # plain loads; chunks of w outputs whose cells and every float read lie inside the
        # row take the plain ones.
        last = builder.add(first, builder.add(ir.Constant(I64, stride * w - 1),
                                              builder.sub(cols_, ir.Constant(I64, 1))))
        interior = builder.and_(
            builder.and_(builder.icmp_signed("==", count, wc),
                         builder.icmp_signed(">=", first, ir.Constant(I64, 0))),
            builder.icmp_signed("<", last, width_))
        with builder.if_else(interior) as (inside_row, at_edge):
            with inside_row:
                emit(builder, at, mask, value_inside)
            with at_edge:
                emit(builder, at, mask, value_at)
    _counted_loop(builder, steps, chunk)


def _pool_cells(w, stride, px, row_, width_, at, first, mask):
    """The two loaders of a chunk's window cell (r, j), ``(value_at, value_inside)``, each
    ``(builder, r, j, fill) -> <w x float>``: ``value_at`` masks the lanes whose column is
    outside ``[0, width)`` or past ``n`` (``fill`` there); ``value_inside``, for a chunk whose
    cells all lie inside the row, loads whole vectors."""
    vi64 = ir.VectorType(I64, w)
    wc = ir.Constant(I64, w)
    lanes = ir.Constant(vi64, [stride * lane for lane in range(w)])

    def value_at(builder, r, j, fill):
        col = builder.add(_splat_i64(builder, builder.add(first, j), w), lanes)
        inside = builder.and_(
            builder.icmp_signed(">=", col, ir.Constant(vi64, [0] * w)),
            builder.icmp_signed("<", col, _splat_i64(builder, width_, w)))
        start = builder.add(builder.add(builder.mul(r, row_), j),
                            builder.mul(at, ir.Constant(I64, stride)))
        return _masked_strided_load(builder, px, start, builder.and_(inside, mask),
                                    stride, w, fill)

    def value_inside(builder, r, j, fill):
        # a whole chunk inside the row: plain loads (stride 2: of 2 w floats, the even
        # ones kept; the last float read is still inside the row, see ``interior``)
        start = builder.add(builder.add(builder.mul(r, row_), j),
                            builder.mul(at, ir.Constant(I64, stride)))
        v = builder.load(_vptr(builder, px, start, w), align=4)
        if stride == 1:
            return v
        v2 = builder.load(_vptr(builder, px, builder.add(start, wc), w), align=4)
        return builder.shuffle_vector(v, v2, ir.Constant(
            ir.VectorType(I32, w), [2 * i for i in range(w)]))
    return value_at, value_inside


def _pool_max_typer(w, stride):
    """The typer of :func:`pool_window` "max": per chunk, the running maximum and its index in
    registers over the window's cells (row-major), then one masked store of each."""
    flt_max = float(numpy.finfo(numpy.float32).max)

    def typer(typingctx, x, x0, row, rows, cols, col0, width, best, arg, b0, n, index0):
        i64 = types.int64
        sig = types.void(x, i64, i64, i64, i64, i64, i64, best, arg, i64, i64, i64)
        return sig, codegen

    def codegen(context, builder, signature, args):
        x_, x0_, row_, rows_, cols_, col0_, width_, best_, arg_, b0_, n_, index0_ = args
        sa = signature.args
        px = builder.gep(_data(context, builder, sa[0], x_), [x0_])
        pb = builder.gep(_data(context, builder, sa[7], best_), [b0_])
        pa = builder.gep(_data(context, builder, sa[8], arg_), [b0_])
        _, mstore = _masked(builder, w)
        _, istore = _int_masked(builder, w)
        it = ir.VectorType(I32, w)
        offsets = ir.Constant(it, [stride * i for i in range(w)])

        def emit(builder, at, mask, value_at):
            best_v = cgutils.alloca_once_value(
                builder, ir.Constant(_vt(w), [-flt_max] * w))
            arg_v = cgutils.alloca_once_value(builder, ir.Constant(it, [-1] * w))
            base = builder.add(index0_, builder.mul(at, ir.Constant(I64, stride)))

            def per_row(builder, r):
                def per_col(builder, j):
                    v = value_at(builder, r, j, float("-inf"))
                    b = builder.load(best_v)
                    gt = builder.fcmp_ordered(">", v, b)
                    where = builder.trunc(builder.add(base, builder.add(
                        builder.mul(r, row_), j)), I32)
                    idx = builder.add(_splat_int(builder, where, w), offsets)
                    builder.store(builder.select(gt, v, b), best_v)
                    builder.store(builder.select(gt, idx, builder.load(arg_v)), arg_v)
                _counted_loop(builder, cols_, per_col)
            _counted_loop(builder, rows_, per_row)
            align = ir.Constant(I32, 4)
            builder.call(mstore, [builder.load(best_v), _vptr(builder, pb, at, w),
                                  align, mask])
            builder.call(istore, [builder.load(arg_v), builder.bitcast(
                builder.gep(pa, [at]), it.as_pointer()), align, mask])
        _pool_chunks(builder, w, stride, px, row_, cols_, col0_, width_, n_, emit)
        return context.get_dummy_value()
    return typer


def _pool_sum_typer(w, stride):
    """The typer of :func:`pool_window` "sum": per chunk, the sum from 0 of the window's cells
    (row-major) in registers, then one masked store."""
    def typer(typingctx, x, x0, row, rows, cols, col0, width, total, t0, n):
        i64 = types.int64
        sig = types.void(x, i64, i64, i64, i64, i64, i64, total, i64, i64)
        return sig, codegen

    def codegen(context, builder, signature, args):
        x_, x0_, row_, rows_, cols_, col0_, width_, tot_, t0_, n_ = args
        sa = signature.args
        px = builder.gep(_data(context, builder, sa[0], x_), [x0_])
        pt = builder.gep(_data(context, builder, sa[7], tot_), [t0_])
        _, mstore = _masked(builder, w)

        def emit(builder, at, mask, value_at):
            acc = cgutils.alloca_once_value(builder, ir.Constant(_vt(w), [0.0] * w))

            def per_row(builder, r):
                def per_col(builder, j):
                    v = value_at(builder, r, j, 0.0)
                    builder.store(builder.fadd(builder.load(acc), v), acc)
                _counted_loop(builder, cols_, per_col)
            _counted_loop(builder, rows_, per_row)
            builder.call(mstore, [builder.load(acc), _vptr(builder, pt, at, w),
                                  ir.Constant(I32, 4), mask])
        _pool_chunks(builder, w, stride, px, row_, cols_, col0_, width_, n_, emit)
        return context.get_dummy_value()
    return typer


# ------------------------------------------------------------------------------------------------
# Pooling over a flat run of outputs: whole vectors, cells found through tables
# ------------------------------------------------------------------------------------------------
#: vectors of outputs a pass of :func:`pool_flat` keeps in flight (independent chains of
#: compares and blends, or of adds, hide their latency)
FLAT_CHUNKS = 4


def _flat_groups(builder, w, n_, body):
    """``for`` each group of :data:`FLAT_CHUNKS` vectors of the run ``[0, n)``:
    ``body(builder, ats, masks, whole)``, the chunks' first elements, their <w x i1> lanes < n
    and whether the group lies wholly inside the run (an i1: its stores need no mask)."""
    wc = ir.Constant(I64, w)
    span = ir.Constant(I64, w * FLAT_CHUNKS)
    groups = builder.sdiv(builder.add(n_, ir.Constant(I64, w * FLAT_CHUNKS - 1)), span)

    def group(builder, g):
        ats, masks = [], []
        for u in range(FLAT_CHUNKS):
            at = builder.add(builder.mul(g, span), ir.Constant(I64, u * w))
            count = builder.sub(n_, at)
            count = builder.select(builder.icmp_signed(">", count, wc), wc, count)
            count = builder.select(builder.icmp_signed("<", count, ir.Constant(I64, 0)),
                                   ir.Constant(I64, 0), count)
            ats.append(at)
            masks.append(_mask(builder, count, w))
        whole = builder.icmp_signed("<=", builder.add(ats[0], span), n_)
        body(builder, ats, masks, whole)
    _counted_loop(builder, groups, group)


def _put(builder, whole, stores):
    """The ``stores`` ``(value, pointer, mask, masked_store)``: plain stores when ``whole``
    (masked stores cost several times a plain one on some CPUs), else masked."""
    with builder.if_else(whole) as (plain, masked):
        with plain:
            for value, pointer, _, _ in stores:
                builder.store(value, pointer, align=4)
        with masked:
            for value, pointer, mask, store in stores:
                builder.call(store, [value, pointer, ir.Constant(I32, 4), mask])


def _cell_mask(builder, pmask, at, cells_, c, w):
    """<w x i1>: the lanes of the chunk starting at element ``at`` whose window cell ``c``
    lies inside the input: ``w`` bits read from the byte table ``pmask`` (``w // 8`` bytes per
    chunk and cell, chunks ``cells`` entries apart), so that the mask costs a load only."""
    mt = ir.IntType(w)
    entry = builder.add(builder.mul(builder.sdiv(at, ir.Constant(I64, w)), cells_), c)
    p = builder.gep(pmask, [builder.mul(entry, ir.Constant(I64, w // 8))])
    return builder.bitcast(builder.load(builder.bitcast(p, mt.as_pointer()), align=1),
                           ir.VectorType(ir.IntType(1), w))


@functools.lru_cache(maxsize=None)
def pool_flat(kind):
    """A pooling window over a flat run of outputs whose cells lie at constant offsets, whole
    vectors at a time (:data:`FLAT_CHUNKS` in flight), cells inside the input told by a table.

    Output ``e < n`` of the run reads its window cell ``c < cells`` (Caffe's scan order: window
    rows, then columns) at ``x[x0 + e + offsets[c]]`` when bit ``e % W`` of the ``W``-bit
    little-endian mask ``valid[(e // W) cells + c]`` is set (``W = vector_width()``; ``valid``
    a uint8 array, ``W // 8`` bytes an entry) and leaves the cell out otherwise. ``valid`` and
    ``origin`` (int32) must be readable to a multiple of ``FLAT_CHUNKS * W`` outputs past ``n``
    (zeros).

    ``kind`` "max": ``run(x, x0, offsets, where, cells, valid, origin, best, arg, b0, n)`` sets
    ``best[b0 + e]`` to the first maximum (strict ``>`` from ``-FLT_MAX``, NaN never wins) and
    ``arg[b0 + e]`` (int32) to ``origin[e] + where[c]`` of its cell, -1 when nothing beat
    ``-FLT_MAX``. ``kind`` "sum": ``run(x, x0, offsets, cells, valid, total, t0, n)`` sets
    ``total[t0 + e]`` to the sum of the same cells added in the same order from ``+0``.
    ``offsets`` int64, ``where`` int32.
    """
    w = vector_width()
    typer = _flat_max_typer(w) if kind == "max" else _flat_sum_typer(w)
    typer.__name__ = f"pool_flat_{kind}"
    return intrinsic(typer)


def _flat_max_typer(w):
    flt_max = float(numpy.finfo(numpy.float32).max)

    def typer(typingctx, x, x0, offsets, where, cells, valid, origin, best, arg, b0, n):
        i64 = types.int64
        sig = types.void(x, i64, offsets, where, i64, valid, origin, best, arg, i64, i64)
        return sig, codegen

    def codegen(context, builder, signature, args):
        x_, x0_, off_, where_, cells_, valid_, origin_, best_, arg_, b0_, n_ = args
        sa = signature.args
        px = builder.gep(_data(context, builder, sa[0], x_), [x0_])
        poff = _data(context, builder, sa[2], off_)
        pwhere = _data(context, builder, sa[3], where_)
        pvalid = _data(context, builder, sa[5], valid_)
        porigin = _data(context, builder, sa[6], origin_)
        pb = builder.gep(_data(context, builder, sa[7], best_), [b0_])
        pa = builder.gep(_data(context, builder, sa[8], arg_), [b0_])
        vt, it = _vt(w), ir.VectorType(I32, w)
        mload, mstore = _masked(builder, w)
        _, istore = _int_masked(builder, w)
        align = ir.Constant(I32, 4)
        low = ir.Constant(vt, [-flt_max] * w)

        def ivec(ptr, at):
            return builder.load(builder.bitcast(builder.gep(ptr, [at]), it.as_pointer()),
                                align=4)

        def chains():
            return ([cgutils.alloca_once_value(builder, low) for _ in range(FLAT_CHUNKS)],
                    [cgutils.alloca_once_value(builder, ir.Constant(it, [-1] * w))
                     for _ in range(FLAT_CHUNKS)])

        def scan(builder, ats, c, chain):
            """Cell ``c`` into the running maxima ``chain``, one chunk of outputs each."""
            off = builder.load(builder.gep(poff, [c]))
            cell = _splat_int(builder, builder.load(builder.gep(pwhere, [c])), w)
            for at, bv, av in zip(ats, *chain):
                # a zeroing masked load (a load only), a compare under the mask
                inside = _cell_mask(builder, pvalid, at, cells_, c, w)
                p = _vptr(builder, px, builder.add(at, off), w)
                v = builder.call(mload, [p, align, inside, ir.Constant(vt, [0.0] * w)])
                old = builder.load(bv)
                gt = builder.and_(builder.fcmp_ordered(">", v, old), inside)
                builder.store(builder.select(gt, v, old), bv)
                builder.store(builder.select(gt, cell, builder.load(av)), av)

        def body(builder, ats, masks, whole):
            # Two running maxima per chunk (twice the chains in flight): the first half of
            # the cells, ``c < h``, and the rest. The later half's maximum replaces the first
            # half's only when strictly greater, which keeps the first maximum in scan order.
            first, later = chains(), chains()
            h = builder.sdiv(builder.add(cells_, ir.Constant(I64, 1)), ir.Constant(I64, 2))

            def pair(builder, c):
                scan(builder, ats, c, first)
                scan(builder, ats, builder.add(h, c), later)
            _counted_loop(builder, builder.sub(cells_, h), pair)
            with builder.if_then(builder.icmp_signed(">", builder.add(h, h), cells_)):
                scan(builder, ats, builder.sub(h, ir.Constant(I64, 1)), first)
            stores = []
            for at, mask, bv, av, lv, la in zip(ats, masks, *first, *later):
                top, late = builder.load(bv), builder.load(lv)
                gt = builder.fcmp_ordered(">", late, top)
                top = builder.select(gt, late, top)
                arg = builder.select(gt, builder.load(la), builder.load(av))
                won = builder.fcmp_ordered(">", top, low)
                idx = builder.select(won, builder.add(ivec(porigin, at), arg),
                                     ir.Constant(it, [-1] * w))
                stores += [(top, _vptr(builder, pb, at, w), mask, mstore),
                           (idx, builder.bitcast(builder.gep(pa, [at]), it.as_pointer()), mask,
                            istore)]
            _put(builder, whole, stores)
        _flat_groups(builder, w, n_, body)
        return context.get_dummy_value()
    return typer


def _flat_sum_typer(w):
    def typer(typingctx, x, x0, offsets, cells, valid, total, t0, n):
        i64 = types.int64
        sig = types.void(x, i64, offsets, i64, valid, total, i64, i64)
        return sig, codegen

    def codegen(context, builder, signature, args):
        x_, x0_, off_, cells_, valid_, tot_, t0_, n_ = args
        sa = signature.args
        px = builder.gep(_data(context, builder, sa[0], x_), [x0_])
        poff = _data(context, builder, sa[2], off_)
        pvalid = _data(context, builder, sa[4], valid_)
        pt = builder.gep(_data(context, builder, sa[5], tot_), [t0_])
        vt = _vt(w)
        mload, mstore = _masked(builder, w)
        align = ir.Constant(I32, 4)
        zero = ir.Constant(vt, [0.0] * w)

        def body(builder, ats, masks, whole):
            accs = [cgutils.alloca_once_value(builder, zero) for _ in ats]

            def per_cell(builder, c):
                off = builder.load(builder.gep(poff, [c]))
                for at, acc in zip(ats, accs):
                    p = _vptr(builder, px, builder.add(at, off), w)
                    inside = _cell_mask(builder, pvalid, at, cells_, c, w)
                    v = builder.call(mload, [p, align, inside, zero])
                    builder.store(builder.fadd(builder.load(acc), v), acc)
            _counted_loop(builder, cells_, per_cell)
            _put(builder, whole, [(builder.load(acc), _vptr(builder, pt, at, w), mask, mstore)
                                  for at, mask, acc in zip(ats, masks, accs)])
        _flat_groups(builder, w, n_, body)
        return context.get_dummy_value()
    return typer


@intrinsic
def split_pairs(typingctx, dst, d_even, d_odd, src, s0, n, readable):
    """``dst[d_even + C] = src[s0 + 2 C]`` and ``dst[d_odd + C] = src[s0 + 2 C + 1]`` for the
    ``n`` floats ``src[s0:s0 + n]`` (a row split into its even and odd columns: two loads and
    two shuffles a vector of each), bit for bit. Whole vectors are stored: ``dst`` must be
    writable ``vector_width()`` floats past each half's end (what lies there is overwritten);
    ``readable`` floats from ``src[s0]`` on may be read (masked loads past them)."""
    w = vector_width()
    i64 = types.int64
    sig = types.void(dst, i64, i64, src, i64, i64, i64)

    def codegen(context, builder, signature, args):
        dst_, de_, do_, src_, s0_, n_, readable_ = args
        sa = signature.args
        pd = _data(context, builder, sa[0], dst_)
        pe, po = builder.gep(pd, [de_]), builder.gep(pd, [do_])
        ps = builder.gep(_data(context, builder, sa[3], src_), [s0_])
        mload, _ = _masked(builder, w)
        wc = ir.Constant(I64, w)
        undef = ir.Constant(_vt(w), ir.Undefined)
        steps = builder.sdiv(builder.add(n_, ir.Constant(I64, 2 * w - 1)),
                             ir.Constant(I64, 2 * w))

        def load(builder, start):
            p = _vptr(builder, ps, start, w)
            inside = builder.icmp_signed("<=", builder.add(start, wc), readable_)
            with builder.if_else(inside) as (plain, masked):
                with plain:
                    whole = builder.load(p, align=4)
                    plain_block = builder.block
                with masked:
                    count = builder.sub(readable_, start)
                    count = builder.select(builder.icmp_signed("<", count, ir.Constant(I64, 0)),
                                           ir.Constant(I64, 0), count)
                    part = builder.call(mload, [p, ir.Constant(I32, 4), _mask(builder, count, w),
                                                undef])
                    masked_block = builder.block
            v = builder.phi(_vt(w))
            v.add_incoming(whole, plain_block)
            v.add_incoming(part, masked_block)
            return v

        def chunk(builder, i):
            at = builder.mul(i, wc)
            first = builder.add(at, at)
            halves = [load(builder, builder.add(first, ir.Constant(I64, half * w)))
                      for half in range(2)]
            for parity, pdst in ((0, pe), (1, po)):
                v = builder.shuffle_vector(halves[0], halves[1], ir.Constant(
                    ir.VectorType(I32, w), [2 * e + parity for e in range(w)]))
                builder.store(v, _vptr(builder, pdst, at, w), align=4)
        _counted_loop(builder, steps, chunk)
        return context.get_dummy_value()
    return sig, codegen


def _splat_i64(builder, value, w):
    vt = ir.VectorType(I64, w)
    vec = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(vec, ir.Constant(vt, ir.Undefined),
                                  ir.Constant(ir.VectorType(I32, w), [0] * w))


# ------------------------------------------------------------------------------------------------
# Strided copies (the interleaved layouts' gathers and scatters)
# ------------------------------------------------------------------------------------------------
def _pointers(builder, base, first, stride, w):
    """<w x float*>: ``base + first + stride * lane`` (element offsets)."""
    vi64 = ir.VectorType(I64, w)
    lanes = ir.Constant(vi64, list(range(w)))
    offsets = builder.add(_splat_i64(builder, first, w),
                          builder.mul(lanes, _splat_i64(builder, stride, w)))
    addresses = builder.add(_splat_i64(builder, builder.ptrtoint(base, I64), w),
                            builder.mul(offsets, ir.Constant(vi64, [4] * w)))
    return builder.inttoptr(addresses, ir.VectorType(F32.as_pointer(), w))


def _strided_codegen(kind, w):
    """``gather``: ``dst[d0 + e] = src[s0 + stride e] + value``; ``scatter``:
    ``dst[d0 + stride e] = src[s0 + e]`` (``stride >= 1``: no two lanes share an address); for
    ``e < n``, ``w`` lanes at a time."""
    def codegen(context, builder, signature, args):
        sa = signature.args
        if kind == "gather":
            dst, d0, src, s0, stride, n, value = args
        else:
            dst, d0, stride, src, s0, n = args
        pd = builder.gep(_data(context, builder, sa[0], dst), [d0])
        ps = builder.gep(_data(context, builder, sa[2 if kind == "gather" else 3], src), [s0])
        vt = _vt(w)
        pt = ir.VectorType(F32.as_pointer(), w)
        mt = ir.VectorType(ir.IntType(1), w)
        mload, mstore = _masked(builder, w)
        gather = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vt, [pt, I32, mt, vt]),
            f"llvm.masked.gather.v{w}f32.v{w}p0")
        scatter = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [vt, pt, I32, mt]),
            f"llvm.masked.scatter.v{w}f32.v{w}p0")
        align = ir.Constant(I32, 4)
        wc = ir.Constant(I64, w)
        steps = builder.sdiv(builder.add(n, ir.Constant(I64, w - 1)), wc)
        zero = ir.Constant(vt, [0.0] * w)

        def body(builder, i):
            at = builder.mul(i, wc)
            count = builder.sub(n, at)
            count = builder.select(builder.icmp_signed(">", count, wc), wc, count)
            mask = _mask(builder, count, w)
            if kind == "gather":
                v = builder.call(gather, [_pointers(builder, ps, builder.mul(at, stride), stride,
                                                    w), align, mask, zero])
                v = builder.fadd(v, _splat(builder, value, w))
                builder.call(mstore, [v, _vptr(builder, pd, at, w), align, mask])
            else:
                v = builder.call(mload, [_vptr(builder, ps, at, w), align, mask, zero])
                where = _pointers(builder, pd, builder.mul(at, stride), stride, w)
                builder.call(scatter, [v, where, align, mask])
        _counted_loop(builder, steps, body)
        return context.get_dummy_value()
    return codegen


@intrinsic
def gather_plus(typingctx, dst, d0, src, s0, stride, n, value):
    """``dst[d0 + e] = src[s0 + stride e] + value`` for ``e < n`` (vector gathers)."""
    i64 = types.int64
    return (types.void(dst, i64, src, i64, i64, i64, types.float32),
            _strided_codegen("gather", vector_width()))


@intrinsic
def scatter_copy(typingctx, dst, d0, stride, src, s0, n):
    """``dst[d0 + stride e] = src[s0 + e]`` for ``e < n`` (vector scatters)."""
    i64 = types.int64
    return (types.void(dst, i64, i64, src, i64, i64),
            _strided_codegen("scatter", vector_width()))


# ------------------------------------------------------------------------------------------------
# AVE pooling's backward: the windows over an input row
# ------------------------------------------------------------------------------------------------
@intrinsic
def window_spread(typingctx, dst, d0, n, src, s0, sstep, rows, cols, shift):
    """AVE pooling's backward for one input row, summed in registers and stored once.

    ``window_spread(dst, d0, n, src, s0, sstep, rows, cols, shift)`` sets, for ``c < n``,
    ``dst[d0 + c]`` to the sum from ``+0`` of ``src[s0 + r sstep + c + shift - j]`` over ``r <
    rows`` (increasing) and ``j`` from ``cols - 1`` down to 0. With ``src``'s rows holding one
    output row of ``dy / size`` each, output ``o`` at ``stride * o`` and zeros between, that is
    Caffe's order of additions into an input cell (outputs in increasing order, from 0); the
    zeros leave a sum started from ``+0`` unchanged. Whole vector loads: ``src`` must be
    readable ``cols - 1`` floats before each row's first term and a vector past its last.
    """
    w = vector_width()
    i64 = types.int64
    sig = types.void(dst, i64, i64, src, i64, i64, i64, i64, i64)

    def codegen(context, builder, signature, args):
        dst_, d0_, n_, src_, s0_, sstep_, rows_, cols_, shift_ = args
        sa = signature.args
        pd = builder.gep(_data(context, builder, sa[0], dst_), [d0_])
        ps = builder.gep(_data(context, builder, sa[3], src_), [s0_])
        _, mstore = _masked(builder, w)
        wc = ir.Constant(I64, w)
        last = builder.sub(cols_, ir.Constant(I64, 1))
        steps = builder.sdiv(builder.add(n_, ir.Constant(I64, w - 1)), wc)

        def chunk(builder, i):
            c0 = builder.mul(i, wc)
            count = builder.sub(n_, c0)
            count = builder.select(builder.icmp_signed(">", count, wc), wc, count)
            acc = cgutils.alloca_once_value(builder, ir.Constant(_vt(w), [0.0] * w))
            start = builder.add(c0, builder.sub(shift_, last))

            def per_row(builder, r):
                row = builder.gep(ps, [builder.add(builder.mul(r, sstep_), start)])

                def per_col(builder, k):   # j = cols - 1 - k
                    term = builder.load(_vptr(builder, row, k, w), align=4)
                    builder.store(builder.fadd(builder.load(acc), term), acc)
                _counted_loop(builder, cols_, per_col)
            _counted_loop(builder, rows_, per_row)
            builder.call(mstore, [builder.load(acc), _vptr(builder, pd, c0, w),
                                  ir.Constant(I32, 4), _mask(builder, count, w)])
        _counted_loop(builder, steps, chunk)
        return context.get_dummy_value()
    return sig, codegen


def _leaf8_codegen(k):
    def codegen(context, builder, signature, args):
        src, s0, stride, n, out, o0 = args
        src_p = _data(context, builder, signature.args[0], src)
        out_p = _data(context, builder, signature.args[4], out)
        eight = ir.Constant(I64, 8)
        blocks = builder.sdiv(n, eight)
        starts = [builder.add(s0, builder.mul(stride, ir.Constant(I64, j))) for j in range(k)]
        accs = [cgutils.alloca_once_value(
            builder, builder.load(_vptr(builder, builder.gep(src_p, [s]), ir.Constant(I64, 0), 8),
                                  align=4)) for s in starts]

        def block(builder, b):
            at = builder.mul(builder.add(b, ir.Constant(I64, 1)), eight)
            for s, acc in zip(starts, accs):
                v = builder.load(_vptr(builder, builder.gep(src_p, [s]), at, 8), align=4)
                builder.store(builder.fadd(builder.load(acc), v), acc)
        _counted_loop(builder, builder.sub(blocks, ir.Constant(I64, 1)), block)
        for j, acc in enumerate(accs):
            r = builder.load(acc)
            lane = [builder.extract_element(r, ir.Constant(I32, i)) for i in range(8)]
            res = builder.fadd(builder.fadd(builder.fadd(lane[0], lane[1]),
                                            builder.fadd(lane[2], lane[3])),
                               builder.fadd(builder.fadd(lane[4], lane[5]),
                                            builder.fadd(lane[6], lane[7])))
            builder.store(res, builder.gep(out_p, [builder.add(o0, ir.Constant(I64, j))]))
        return context.get_dummy_value()
    return codegen


def _leaf8_intrinsic(k):
    @intrinsic
    def leaf(typingctx, src, s0, stride, n, out, o0):
        sig = types.void(src, types.int64, types.int64, types.int64, out, types.int64)
        return sig, _leaf8_codegen(k)
    return leaf


#: ``leaf8(src, s0, stride, n, out, o0)``: NumPy's pairwise-sum leaf (8 running sums over
#: blocks of 8, then ``((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))``) of
#: ``src[s0:s0 + n - n % 8]`` into ``out[o0]``, for 8 <= n; ``leaf8x4`` the same for the four
#: runs at ``s0``, ``s0 + stride``, ``s0 + 2 stride``, ``s0 + 3 stride`` into ``out[o0:o0 + 4]``,
#: interleaved (four independent chains of vector adds). The caller adds the ``n % 8`` rest.
leaf8 = _leaf8_intrinsic(1)
leaf8x4 = _leaf8_intrinsic(4)


# ------------------------------------------------------------------------------------------------
# Depthwise convolution: a table of taps applied to rows of vectors, in registers
# ------------------------------------------------------------------------------------------------
#: Rows of :func:`taps_rows` (chunks of :func:`dot_taps_rows`) carried in registers at once.
_UNROLL = 4
#: Taps of :func:`dot_taps_rows` summed in one pass over ``a`` (a kernel row of a 3x3 kernel).
_TAPS_A_PASS = 3


def _chunk_mask(builder, cols, c, w):
    """<w x i1>: the lanes of the chunk at column ``c`` that are below ``cols``."""
    count = builder.sub(cols, c)
    wc = ir.Constant(I64, w)
    return _mask(builder, builder.select(builder.icmp_signed(">", count, wc), wc, count), w)


def _taps_rows_codegen(w):
    """Codegen of :func:`taps_rows`: ``_UNROLL`` rows of a chunk at a time, then single rows."""
    def codegen(context, builder, signature, args):
        (dst, d0, dstride, src, s0, sstride, rows, cols, offs, o0, wts, w0, k, bias,
         has_bias) = args
        sa = signature.args
        pd = builder.gep(_data(context, builder, sa[0], dst), [d0])
        ps = builder.gep(_data(context, builder, sa[3], src), [s0])
        po = builder.gep(_data(context, builder, sa[8], offs), [o0])
        pw = builder.gep(_data(context, builder, sa[10], wts), [w0])
        vt = _vt(w)
        zero = ir.Constant(vt, [0.0] * w)
        mload, mstore = _masked(builder, w)
        fma = _fma(builder, w)
        align = ir.Constant(I32, 4)
        add_bias = builder.icmp_unsigned("!=", has_bias, ir.Constant(has_bias.type, 0))
        bias_v = _splat(builder, bias, w)
        wc = ir.Constant(I64, w)
        chunks = builder.sdiv(builder.add(cols, ir.Constant(I64, w - 1)), wc)
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(_UNROLL)]

        def rows_at(builder, r0, count):
            def chunk(builder, ci):
                c = builder.mul(ci, wc)
                mask = _chunk_mask(builder, cols, c, w)
                srcs = [builder.gep(ps, [builder.add(builder.mul(builder.add(
                    r0, ir.Constant(I64, j)), sstride), c)]) for j in range(count)]
                for j in range(count):
                    builder.store(zero, accs[j])

                def tap(builder, t):
                    wv = _splat(builder, builder.load(builder.gep(pw, [t])), w)
                    off = builder.load(builder.gep(po, [t]))
                    for j in range(count):
                        v = builder.call(mload, [_vptr(builder, srcs[j], off, w), align, mask,
                                                 zero])
                        builder.store(builder.call(fma, [wv, v, builder.load(accs[j])]),
                                      accs[j])
                _counted_loop(builder, k, tap)
                for j in range(count):
                    acc = builder.load(accs[j])
                    acc = builder.select(add_bias, builder.fadd(acc, bias_v), acc)
                    at = builder.add(builder.mul(builder.add(r0, ir.Constant(I64, j)), dstride),
                                     c)
                    builder.call(mstore, [acc, _vptr(builder, pd, at, w), align, mask])
            _counted_loop(builder, chunks, chunk)

        _unrolled_rows(builder, rows, rows_at)
        return context.get_dummy_value()
    return codegen


@intrinsic
def taps_rows(typingctx, dst, d0, dstride, src, s0, sstride, rows, cols, offs, o0, wts, w0, k,
              bias, has_bias):
    """A table of ``k`` taps over ``rows x cols`` outputs: for ``r < rows``, ``c < cols``,
    ``dst[d0 + r dstride + c]`` = the fused multiply-adds from +0 of ``wts[w0 + t]`` times
    ``src[s0 + r sstride + offs[o0 + t] + c]`` for ``t < k`` in increasing order, plus ``bias``
    when ``has_bias`` (one addition after the taps). ``offs`` int64 (may be negative),
    ``has_bias`` bool; the other arrays float32. Sums stay in registers, ``_UNROLL`` rows of
    a vector at a time; the last vector of a row masked."""
    i64 = types.int64
    sig = types.void(dst, i64, i64, src, i64, i64, i64, i64, offs, i64, wts, i64, i64,
                     types.float32, types.boolean)
    return sig, _taps_rows_codegen(vector_width())


def _taps3x3_codegen(w, sign):
    """Codegen of :func:`taps3x3_rows` (``sign`` +1) and :func:`taps3x3_rows_back` (-1):
    ``_UNROLL`` rows of a chunk at a time (then single rows), each input row's three column
    shifts loaded once for every output row that reads them, the nine weights in registers."""
    def codegen(context, builder, signature, args):
        dst, d0, dstride, src, s0, sstride, rows, cols, wts, w0, bias, has_bias = args
        sa = signature.args
        pd = builder.gep(_data(context, builder, sa[0], dst), [d0])
        ps = builder.gep(_data(context, builder, sa[3], src), [s0])
        pw = builder.gep(_data(context, builder, sa[8], wts), [w0])
        vt = _vt(w)
        zero = ir.Constant(vt, [0.0] * w)
        mload, mstore = _masked(builder, w)
        fma = _fma(builder, w)
        align = ir.Constant(I32, 4)
        add_bias = builder.icmp_unsigned("!=", has_bias, ir.Constant(has_bias.type, 0))
        bias_v = _splat(builder, bias, w)
        wv = [[_splat(builder, builder.load(builder.gep(pw, [ir.Constant(I64, 3 * i + j)])), w)
               for j in range(3)] for i in range(3)]
        wc = ir.Constant(I64, w)
        chunks = builder.sdiv(builder.add(cols, ir.Constant(I64, w - 1)), wc)

        def rows_at(builder, r0, count):
            # input rows (relative to r0) in the order that takes each output's taps row by
            # row of the kernel: output u reads row u + sign i for kernel row i
            order = sorted({u + sign * i for u in range(count) for i in range(3)},
                           key=lambda rho: sign * rho)

            def chunk(builder, ci):
                c = builder.mul(ci, wc)
                mask = _chunk_mask(builder, cols, c, w)
                accs = [zero] * count
                for rho in order:
                    row = builder.gep(ps, [builder.add(builder.mul(builder.add(
                        r0, ir.Constant(I64, rho)), sstride), c)])
                    for j in range(3):
                        v = builder.call(mload, [_vptr(builder, row, ir.Constant(I64, sign * j),
                                                       w), align, mask, zero])
                        for u in range(count):
                            i = sign * (rho - u)
                            if 0 <= i < 3:
                                accs[u] = builder.call(fma, [wv[i][j], v, accs[u]])
                for u in range(count):
                    acc = builder.select(add_bias, builder.fadd(accs[u], bias_v), accs[u])
                    at = builder.add(builder.mul(builder.add(r0, ir.Constant(I64, u)), dstride),
                                     c)
                    builder.call(mstore, [acc, _vptr(builder, pd, at, w), align, mask])
            _counted_loop(builder, chunks, chunk)

        _unrolled_rows(builder, rows, rows_at)
        return context.get_dummy_value()
    return codegen


def _taps3x3_typer(sign):
    def typer(typingctx, dst, d0, dstride, src, s0, sstride, rows, cols, wts, w0, bias,
              has_bias):
        i64 = types.int64
        sig = types.void(dst, i64, i64, src, i64, i64, i64, i64, wts, i64, types.float32,
                         types.boolean)
        return sig, _taps3x3_codegen(vector_width(), sign)
    typer.__name__ = "taps3x3_rows" if sign > 0 else "taps3x3_rows_back"
    return intrinsic(typer)


#: ``taps3x3_rows(dst, d0, dstride, src, s0, sstride, rows, cols, wts, w0, bias, has_bias)``:
#: :func:`taps_rows` for a 3x3 kernel of unit stride and dilation, tap (i, j) (``wts[w0 + 3 i +
#: j]``) at ``i sstride + j``: the same fused multiply-adds in the same order (so the same
#: bits), each loaded vector used by every output row that reads it. ``taps3x3_rows_back``:
#: tap (i, j) at ``-(i sstride + j)`` (the data gradient's gather).
taps3x3_rows = _taps3x3_typer(1)
taps3x3_rows_back = _taps3x3_typer(-1)


def _lanes_sum(builder, v, w):
    """The sum of a <w x float>'s lanes: halves added pairwise (lane i + lane i + w/2, ...)."""
    while w > 1:
        half = w // 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, half),
                                                      list(range(half))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, half),
                                                      list(range(half, w))))
        v, w = builder.fadd(lo, hi), half
    return builder.extract_element(v, ir.Constant(I32, 0))


def _dot_taps_codegen(w):
    """Codegen of :func:`dot_taps_rows`: :data:`_TAPS_A_PASS` taps a pass over the rows (one
    load of ``a`` for them all), then the rest one by one; per tap, the chunks of each row dealt
    round ``_UNROLL`` accumulators (whole groups unmasked, the rest one by one, the last
    masked)."""
    def codegen(context, builder, signature, args):
        a, a0, astride, b, b0, bstride, rows, cols, offs, o0, k, out, out0 = args
        sa = signature.args
        pa = builder.gep(_data(context, builder, sa[0], a), [a0])
        pb = builder.gep(_data(context, builder, sa[3], b), [b0])
        po = builder.gep(_data(context, builder, sa[8], offs), [o0])
        pout = builder.gep(_data(context, builder, sa[11], out), [out0])
        vt = _vt(w)
        zero = ir.Constant(vt, [0.0] * w)
        mload, _ = _masked(builder, w)
        fma = _fma(builder, w)
        align = ir.Constant(I32, 4)
        wc = ir.Constant(I64, w)
        u = ir.Constant(I64, _UNROLL)
        chunks = builder.sdiv(builder.add(cols, ir.Constant(I64, w - 1)), wc)
        groups = builder.sdiv(cols, builder.mul(wc, u))
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(_UNROLL)]
                for _ in range(_TAPS_A_PASS)]

        def taps(builder, t0, count):
            offsets = [builder.load(builder.gep(po, [builder.add(t0, ir.Constant(I64, g))]))
                       for g in range(count)]
            for tap_accs in accs[:count]:
                for acc in tap_accs:
                    builder.store(zero, acc)

            def row(builder, r):
                ra = builder.gep(pa, [builder.mul(r, astride)])
                rb = [builder.gep(pb, [builder.add(builder.mul(r, bstride), off)])
                      for off in offsets]

                def chunk(builder, c, j, mask):
                    if mask is None:
                        x = builder.load(_vptr(builder, ra, c, w), align=4)
                    else:
                        x = builder.call(mload, [_vptr(builder, ra, c, w), align, mask, zero])
                    for g in range(count):
                        if mask is None:
                            y = builder.load(_vptr(builder, rb[g], c, w), align=4)
                        else:
                            y = builder.call(mload, [_vptr(builder, rb[g], c, w), align, mask,
                                                     zero])
                        acc = accs[g][j]
                        builder.store(builder.call(fma, [x, y, builder.load(acc)]), acc)

                def group(builder, gi):
                    for j in range(_UNROLL):
                        chunk(builder, builder.mul(builder.add(builder.mul(gi, u),
                                                               ir.Constant(I64, j)), wc), j, None)
                _counted_loop(builder, groups, group)
                first = builder.mul(groups, u)
                for j in range(_UNROLL):      # the rest: at most _UNROLL chunks
                    ci = builder.add(first, ir.Constant(I64, j))
                    with builder.if_then(builder.icmp_signed("<", ci, chunks)):
                        c = builder.mul(ci, wc)
                        chunk(builder, c, j, _chunk_mask(builder, cols, c, w))
            _counted_loop(builder, rows, row)
            for g in range(count):
                s = [builder.load(acc) for acc in accs[g]]
                total = builder.fadd(builder.fadd(s[0], s[1]), builder.fadd(s[2], s[3]))
                builder.store(_lanes_sum(builder, total, w),
                              builder.gep(pout, [builder.add(t0, ir.Constant(I64, g))]))
        npass = ir.Constant(I64, _TAPS_A_PASS)
        passes = builder.sdiv(k, npass)
        _counted_loop(builder, passes, lambda b, i: taps(b, b.mul(i, npass), _TAPS_A_PASS))
        done = builder.mul(passes, npass)
        _counted_loop(builder, builder.sub(k, done), lambda b, i: taps(b, b.add(done, i), 1))
        return context.get_dummy_value()
    return codegen


@intrinsic
def dot_taps_rows(typingctx, a, a0, astride, b, b0, bstride, rows, cols, offs, o0, k, out, out0):
    """A table of ``k`` shifted dot products over ``rows x cols`` elements: for ``t < k``,
    ``out[out0 + t]`` = the sum of ``a[a0 + r astride + c] * b[b0 + r bstride + offs[o0 + t] +
    c]`` over ``r < rows``, ``c < cols`` (fused multiply-adds into ``_UNROLL`` vector sums, the
    chunks of a row dealt round them, then the sums pairwise and the lanes pairwise: float32
    rounding of the sum, in a fixed order). ``offs`` int64; the other arrays float32."""
    i64 = types.int64
    sig = types.void(a, i64, i64, b, i64, i64, i64, i64, offs, i64, i64, out, i64)
    return sig, _dot_taps_codegen(vector_width())


def _pair_codegen(kind, w):
    """``split``: ``even[e0 + m] = src[s0 + 2m]``, ``odd[o0 + m] = src[s0 + 2m + 1]`` for the
    ``n`` floats of ``src``; ``merge``: the inverse into the ``n`` floats of ``dst``. Two
    vectors of the interleaved side at a time, shuffled (no gathers or scatters)."""
    def codegen(context, builder, signature, args):
        sa = signature.args
        if kind == "split":
            even, e0, odd, o0, line, l0, n = args
            lp = builder.gep(_data(context, builder, sa[4], line), [l0])
        else:
            line, l0, even, e0, odd, o0, n = args
            lp = builder.gep(_data(context, builder, sa[0], line), [l0])
        ep = builder.gep(_data(context, builder, sa[0 if kind == "split" else 2], even), [e0])
        op = builder.gep(_data(context, builder, sa[2 if kind == "split" else 4], odd), [o0])
        vt = _vt(w)
        zero = ir.Constant(vt, [0.0] * w)
        mload, mstore = _masked(builder, w)
        align = ir.Constant(I32, 4)
        one = ir.Constant(I64, 1)
        wc, w2 = ir.Constant(I64, w), ir.Constant(I64, 2 * w)

        def clamp(builder, count):
            count = builder.select(builder.icmp_signed(">", count, wc), wc, count)
            return builder.select(builder.icmp_signed("<", count, ir.Constant(I64, 0)),
                                  ir.Constant(I64, 0), count)

        def body(builder, i, whole):
            at = builder.mul(i, w2)
            count = builder.sub(n, at)
            if whole:
                lo_m = hi_m = ev_m = od_m = None
            else:
                lo_m, hi_m, ev_m, od_m = masks(builder, count)
            half = builder.mul(i, wc)
            lo_p, hi_p = _vptr(builder, lp, at, w), _vptr(builder, lp, builder.add(at, wc), w)
            ev_p, od_p = _vptr(builder, ep, half, w), _vptr(builder, op, half, w)

            def load(ptr, mask):
                if mask is None:
                    return builder.load(ptr, align=4)
                return builder.call(mload, [ptr, align, mask, zero])

            def store(v, ptr, mask):
                if mask is None:
                    builder.store(v, ptr, align=4)
                else:
                    builder.call(mstore, [v, ptr, align, mask])
            if kind == "split":
                lo, hi = load(lo_p, lo_m), load(hi_p, hi_m)
                ev = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, w),
                                                                list(range(0, 2 * w, 2))))
                od = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, w),
                                                                list(range(1, 2 * w, 2))))
                store(ev, ev_p, ev_m)
                store(od, od_p, od_m)
            else:
                ev, od = load(ev_p, ev_m), load(od_p, od_m)
                lanes = [v for m in range(w) for v in (m, w + m)]
                lo = builder.shuffle_vector(ev, od, ir.Constant(ir.VectorType(I32, w),
                                                                lanes[:w]))
                hi = builder.shuffle_vector(ev, od, ir.Constant(ir.VectorType(I32, w),
                                                                lanes[w:]))
                store(lo, lo_p, lo_m)
                store(hi, hi_p, hi_m)

        def masks(builder, count):
            lo_m = _mask(builder, clamp(builder, count), w)
            hi_m = _mask(builder, clamp(builder, builder.sub(count, wc)), w)
            ev_m = _mask(builder, clamp(builder, builder.sdiv(builder.add(count, one),
                                                              ir.Constant(I64, 2))), w)
            od_m = _mask(builder, clamp(builder, builder.sdiv(count, ir.Constant(I64, 2))), w)
            return lo_m, hi_m, ev_m, od_m

        whole = builder.sdiv(n, w2)
        _counted_loop(builder, whole, lambda b, i: body(b, i, True))
        with builder.if_then(builder.icmp_signed("<", builder.mul(whole, w2), n)):
            body(builder, whole, False)
        return context.get_dummy_value()
    return codegen


@intrinsic
def deinterleave(typingctx, even, e0, odd, o0, src, s0, n):
    """``even[e0 + m] = src[s0 + 2m]`` and ``odd[o0 + m] = src[s0 + 2m + 1]`` for the ``n``
    floats of ``src`` (every value's bits kept): a stride-2 row's two phases, by shuffles."""
    i64 = types.int64
    return (types.void(even, i64, odd, i64, src, i64, i64),
            _pair_codegen("split", vector_width()))


@intrinsic
def interleave(typingctx, dst, d0, even, e0, odd, o0, n):
    """``dst[d0 + 2m] = even[e0 + m]`` and ``dst[d0 + 2m + 1] = odd[o0 + m]`` for the ``n``
    floats of ``dst``: the inverse of :func:`deinterleave`."""
    i64 = types.int64
    return (types.void(dst, i64, even, i64, odd, i64, i64),
            _pair_codegen("merge", vector_width()))
