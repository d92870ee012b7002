"""LARC: a learning rate per learnable blob from the ratio of its weight and gradient norms.

Layer-wise adaptive rate control, NVIDIA Caffe's (NVCaffe's) form of LARS (You, Gitman and
Ginsburg 2017, "Large Batch Training of Convolutional Networks", arXiv:1708.03888). With
``larc: true`` each learnable blob whose ``lr_mult`` is > 0 gets, every iteration, the local rate

    local = (1 - momentum) * larc_eta * ||w|| / ||g||        (1 when either norm is 0)

where ``w`` is the blob's weights and ``g`` its gradient after ``clip_gradients`` and the
``iter_size`` normalisation, before weight decay is added. The rate the update rule then uses
in place of Caffe's ``lr * lr_mult`` is, by ``larc_policy``:

* ``"scale"`` (NVCaffe's default): ``lr * local``;
* ``"clip"``: ``min(lr, local)``: the global schedule is a ceiling that LARC may only lower.

``lr`` is the solver's rate (the ``lr_policy`` and warm-up of ``lr_policy.py``). Blobs with
``lr_mult`` <= 0 keep ``lr * lr_mult`` (frozen blobs stay frozen). Weight decay, momentum and
the rest of the step are those of the update rule (SGD or Nesterov), unchanged.

How this relates to the formula usually quoted for LARS, ``eta * ||w|| / (||g|| + wd * ||w||)``
(You et al., Algorithm 1; also NVIDIA apex's LARC): NVCaffe (1) leaves weight decay out of the
denominator (its GPU path adds the decay inside the update kernel, after the norms), (2)
multiplies by ``(1 - momentum)``, so that the momentum's geometric sum ``1 / (1 - momentum)``
does not enlarge the step, and (3) drops ``lr_mult`` for the blobs LARC rates. This engine
follows NVCaffe, so that an NVCaffe solver file trains as it does there. (NVCaffe's CPU path
measures ``||g||`` after the decay was added; its GPU path, the one its recipes use, before.)
``larc_trust: "lars"`` (engine-only field) uses You et al.'s ratio instead,
``larc_eta * ||w|| / (||g|| + wd * ||w||)`` with the blob's weight decay ``wd`` (the solver's
``weight_decay`` times the blob's ``decay_mult``) and no momentum factor; the policies apply to
it alike. NVCaffe applies LARC to SGD only; here Nesterov takes it too. ``larc_turbo`` (NVCaffe's
correction by the gradient/momentum correlation, state it does not snapshot) is refused.

Arithmetic in float32 as NVCaffe's: ``((1 - momentum) * eta) * ||w|| / ||g||``; the norms are
square roots of sums of squares accumulated in float64 (the kernel set's ``param_norms``).

NVCaffe: src/caffe/solvers/sgd_solver.cpp (SGDSolver::GetLocalRate, ComputeUpdateValue);
fields ``larc`` (49), ``larc_policy`` (50), ``larc_eta`` (51), ``larc_turbo`` (55) of its
SolverParameter.
"""
import numpy

from ..backend import get_array_module
from ..errors import CaffeError
from ..log import g

f32 = numpy.float32

#: larc_policy values.
POLICIES = ("clip", "scale")
#: Update rules LARC is applied on top of.
RULES = ("SGD", "Nesterov")
#: larc_trust values: NVCaffe's ratio and You et al.'s.
TRUSTS = ("nvcaffe", "lars")


def check_larc(param, solver_type):
    """Refuse LARC settings that cannot run (nothing is checked while ``larc`` is false).

    Raises:
        CaffeError: one line naming the field: an unknown ``larc_policy``, ``larc_eta`` not
            > 0, ``larc_turbo`` true, or a ``type`` other than SGD/Nesterov.
    """
    if not param.larc:
        return
    if param.larc_policy not in POLICIES:
        raise CaffeError(f"solver: unknown larc_policy '{param.larc_policy}' "
                         f"(known: {', '.join(POLICIES)})")
    if param.larc_trust not in TRUSTS:
        raise CaffeError(f"solver: unknown larc_trust '{param.larc_trust}' "
                         f"(known: {', '.join(TRUSTS)})")
    if not param.larc_eta > 0:
        raise CaffeError(f"solver: larc_eta must be > 0 (got {g(f32(param.larc_eta))})")
    if param.larc_turbo:
        raise CaffeError("solver: larc_turbo is not supported (NVCaffe's LARC correction); "
                         "set it to false")
    if solver_type not in RULES:
        raise CaffeError(f"solver: larc applies to type {' or '.join(RULES)}, "
                         f"not '{solver_type}'")


def local_rate(rate, w_norm, g_norm, momentum, eta, policy, trust_ratio="nvcaffe",
               weight_decay=0.0):
    """The rate one blob's update uses under LARC (float32).

    Args:
        rate: the solver's rate for this iteration.
        w_norm, g_norm: ``||w||`` and ``||g||`` of the blob (the gradient as the rule will see
            it before weight decay): host numbers, or 0-d float32 device arrays.
        momentum: the solver's momentum; eta: ``larc_eta``; policy: "clip" or "scale".
        trust_ratio: "nvcaffe" or "lars" (``larc_trust``); weight_decay: the blob's, for "lars".

    Returns:
        a ``numpy.float32``, or with device norms a 0-d float32 device array: branch-free
        (``where``), so that nothing is read back; the values are the same either way.
    """
    w, gn = _f32(w_norm), _f32(g_norm)
    xp = get_array_module(w, gn)
    ok = (w > 0) & (gn > 0)
    # The norms are the left operands (float32 * and + commute exactly): a device value is
    # never handed to a NumPy scalar's operator.
    if trust_ratio == "lars":
        num = w * f32(eta)
        den = gn + w * f32(weight_decay)
    else:
        num = w * f32(f32(f32(1) - f32(momentum)) * f32(eta))
        den = gn
    trust = xp.where(ok, num / xp.where(ok, den, f32(1)), f32(1)).astype(f32)
    rate = f32(rate)
    if policy == "clip":     # Python's min(rate, trust): trust only when smaller
        return xp.where(trust < rate, trust, rate).astype(f32)[()]
    return (trust * rate).astype(f32)[()]


def _f32(x):
    """``x`` as float32 where it is: a host number becomes a ``numpy.float32``, an array
    (NumPy scalar, device array) is cast without being read."""
    return x.astype(f32) if hasattr(x, "astype") else f32(x)
