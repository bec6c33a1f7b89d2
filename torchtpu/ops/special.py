"""Special functions and numeric odds and ends (jax.scipy.special where it has them).

Where jax has no matching function (Airy, Bessel J/Y/K, the orthogonal polynomials,
trigamma) the formulas follow PyTorch's CPU kernels (aten/src/ATen/native/Math.h, the
Cephes rational / Chebyshev approximations) so float32 results agree to rounding.
Data-dependent output sizes (bincount) and host-visible results (equal) are kernels.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import torch
from jax import lax

from ..runtime import sync_debug
from ..runtime.jaxenv import to_jax_dtype
from ._common import scalar_type_name
from .promotion import promote as _promote
from .registry import DEFAULT, INT_TO_FLOAT, kernel, lower

# --- Cephes coefficient tables (as used by PyTorch's Math.h) -------------------
_AIRY_AI = {
    "AN": (
        3.46538101525629032477e-01, 1.20075952739645805542e+01, 7.62796053615234516538e+01,
        1.68089224934630576269e+02, 1.59756391350164413639e+02, 7.05360906840444183113e+01,
        1.40264691163389668864e+01, 9.99999999999999995305e-01,
    ),
    "AD": (
        5.67594532638770212846e-01, 1.47562562584847203173e+01, 8.45138970141474626562e+01,
        1.77318088145400459522e+02, 1.64234692871529701831e+02, 7.14778400825575695274e+01,
        1.40959135607834029598e+01, 1.00000000000000000470e+00,
    ),
    "AFN": (
        -1.31696323418331795333e-01, -6.26456544431912369773e-01, -6.93158036036933542233e-01,
        -2.79779981545119124951e-01, -4.91900132609500318020e-02, -4.06265923594885404393e-03,
        -1.59276496239262096340e-04, -2.77649108155232920844e-06, -1.67787698489114633780e-08,
    ),
    "AFD": (
        1.33560420706553243746e+01, 3.26825032795224613948e+01, 2.67367040941499554804e+01,
        9.18707402907259625840e+00, 1.47529146771666414581e+00, 1.15687173795188044134e-01,
        4.40291641615211203805e-03, 7.54720348287414296618e-05, 4.51850092970580378464e-07,
    ),
    "AGN": (
        1.97339932091685679179e-02, 3.91103029615688277255e-01, 1.06579897599595591108e+00,
        9.39169229816650230044e-01, 3.51465656105547619242e-01, 6.33888919628925490927e-02,
        5.85804113048388458567e-03, 2.82851600836737019778e-04, 6.98793669997260967291e-06,
        8.11789239554389293311e-08, 3.41551784765923618484e-10,
    ),
    "AGD": (
        9.30892908077441974853e+00, 1.98352928718312140417e+01, 1.55646628932864612953e+01,
        5.47686069422975497931e+00, 9.54293611618961883998e-01, 8.64580826352392193095e-02,
        4.12656523824222607191e-03, 1.01259085116509135510e-04, 1.17166733214413521882e-06,
        4.91834570062930015649e-09,
    ),
}
_BESSEL_J0 = {
    "PP": (
        7.96936729297347051624e-04, 8.28352392107440799803e-02, 1.23953371646414299388e+00,
        5.44725003058768775090e+00, 8.74716500199817011941e+00, 5.30324038235394892183e+00,
        9.99999999999999997821e-01,
    ),
    "PQ": (
        9.24408810558863637013e-04, 8.56288474354474431428e-02, 1.25352743901058953537e+00,
        5.47097740330417105182e+00, 8.76190883237069594232e+00, 5.30605288235394617618e+00,
        1.00000000000000000218e+00,
    ),
    "QP": (
        -1.13663838898469149931e-02, -1.28252718670509318512e+00, -1.95539544257735972385e+01,
        -9.32060152123768231369e+01, -1.77681167980488050595e+02, -1.47077505154951170175e+02,
        -5.14105326766599330220e+01, -6.05014350600728481186e+00,
    ),
    "QQ": (
        6.43178256118178023184e+01, 8.56430025976980587198e+02, 3.88240183605401609683e+03,
        7.24046774195652478189e+03, 5.93072701187316984827e+03, 2.06209331660327847417e+03,
        2.42005740240291393179e+02,
    ),
    "RP": (
        -4.79443220978201773821e+09, 1.95617491946556577543e+12, -2.49248344360967716204e+14,
        9.70862251047306323952e+15,
    ),
    "RQ": (
        4.99563147152651017219e+02, 1.73785401676374683123e+05, 4.84409658339962045305e+07,
        1.11855537045356834862e+10, 2.11277520115489217587e+12, 3.10518229857422583814e+14,
        3.18121955943204943306e+16, 1.71086294081043136091e+18,
    ),
}
_BESSEL_J1 = {
    "PP": (
        7.62125616208173112003e-04, 7.31397056940917570436e-02, 1.12719608129684925192e+00,
        5.11207951146807644818e+00, 8.42404590141772420927e+00, 5.21451598682361504063e+00,
        1.00000000000000000254e+00,
    ),
    "PQ": (
        5.71323128072548699714e-04, 6.88455908754495404082e-02, 1.10514232634061696926e+00,
        5.07386386128601488557e+00, 8.39985554327604159757e+00, 5.20982848682361821619e+00,
        9.99999999999999997461e-01,
    ),
    "QP": (
        5.10862594750176621635e-02, 4.98213872951233449420e+00, 7.58238284132545283818e+01,
        3.66779609360150777800e+02, 7.10856304998926107277e+02, 5.97489612400613639965e+02,
        2.11688757100572135698e+02, 2.52070205858023719784e+01,
    ),
    "QQ": (
        7.42373277035675149943e+01, 1.05644886038262816351e+03, 4.98641058337653607651e+03,
        9.56231892404756170795e+03, 7.99704160447350683650e+03, 2.82619278517639096600e+03,
        3.36093607810698293419e+02,
    ),
    "RP": (
        -8.99971225705559398224e+08, 4.52228297998194034323e+11, -7.27494245221818276015e+13,
        3.68295732863852883286e+15,
    ),
    "RQ": (
        6.20836478118054335476e+02, 2.56987256757748830383e+05, 8.35146791431949253037e+07,
        2.21511595479792499675e+10, 4.74914122079991414898e+12, 7.84369607876235854894e+14,
        8.95222336184627338078e+16, 5.32278620332680085395e+18,
    ),
}
_BESSEL_Y0 = {
    **{k: _BESSEL_J0[k] for k in ("PP", "PQ", "QP", "QQ")},  # the same asymptotic expansion as J's
    "YP": (
        1.55924367855235737965e+04, -1.46639295903971606143e+07, 5.43526477051876500413e+09,
        -9.82136065717911466409e+11, 8.75906394395366999549e+13, -3.46628303384729719441e+15,
        4.42733268572569800351e+16, -1.84950800436986690637e+16,
    ),
    "YQ": (
        1.04128353664259848412e+03, 6.26107330137134956842e+05, 2.68919633393814121987e+08,
        8.64002487103935000337e+10, 2.02979612750105546709e+13, 3.17157752842975028269e+15,
        2.50596256172653059228e+17,
    ),
}
_BESSEL_Y1 = {
    **{k: _BESSEL_J1[k] for k in ("PP", "PQ", "QP", "QQ")},  # the same asymptotic expansion as J's
    "YP": (
        1.26320474790178026440e+09, -6.47355876379160291031e+11, 1.14509511541823727583e+14,
        -8.12770255501325109621e+15, 2.02439475713594898196e+17, -7.78877196265950026825e+17,
    ),
    "YQ": (
        5.94301592346128195359e+02, 2.35564092943068577943e+05, 7.34811944459721705660e+07,
        1.87601316108706159478e+10, 3.88231277496238566008e+12, 6.20557727146953693363e+14,
        6.87141087355300489866e+16, 3.97270608116560655612e+18,
    ),
}
_MODIFIED_BESSEL_K0 = {
    "A": (
        1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11,
        1.90451637722020886025e-09, 2.53479107902614945675e-07, 2.28621210311945178607e-05,
        1.26461541144692592338e-03, 3.59799365153615016266e-02, 3.44289899924628486886e-01,
        -5.35327393233902768720e-01,
    ),
    "B": (
        5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17,
        -1.67823109680541210385e-16, 5.51205597852431940784e-16, -1.84859337734377901440e-15,
        6.34007647740507060557e-15, -2.22751332699166985548e-14, 8.03289077536357521100e-14,
        -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
        1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10,
        -1.69753450938905987466e-09, 8.57403401741422608519e-09, -4.66048989768794782956e-08,
        2.76681363944501510342e-07, -1.83175552271911948767e-06, 1.39498137188764993662e-05,
        -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
        2.44030308206595545468e+00,
    ),
}
_MODIFIED_BESSEL_K1 = {
    "A": (
        -7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13,
        -1.41148839263352776110e-10, -2.21338763073472585583e-08, -2.43340614156596823496e-06,
        -1.73028895751305206302e-04, -6.97572385963986435018e-03, -1.22611180822657148235e-01,
        -3.53155960776544875667e-01, 1.52530022733894777053e+00,
    ),
    "B": (
        -5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17,
        1.83809354436663880070e-16, -6.05704724837331885336e-16, 2.03870316562433424052e-15,
        -7.01983709041831346144e-15, 2.47715442448130437068e-14, -8.97670518232499435011e-14,
        3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
        -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10,
        2.01504975519703286596e-09, -1.03457624656780970260e-08, 5.74108412545004946722e-08,
        -3.50196060308781257119e-07, 2.40648494783721712015e-06, -1.93619797416608296024e-05,
        1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
        2.72062619048444266945e+00,
    ),
}


# --- helpers -----------------------------------------------------------------


def _polevl(z, coeffs):
    r = jnp.zeros_like(z)
    for c in coeffs:
        r = r * z + c
    return r


def _chbevl(y, coeffs):
    """Clenshaw sum of a Chebyshev series, Cephes style: 0.5 * (b0 - b2)."""
    p = jnp.zeros_like(y)
    q = jnp.zeros_like(y)
    a = jnp.full_like(y, coeffs[0])
    for c in coeffs[1:]:
        p, q = q, a
        a = y * q - p + c
    return 0.5 * (a - p)


def _full(x, v):
    return jnp.full(jnp.shape(x), v, x.dtype)


def _unary(name, promote=INT_TO_FLOAT):
    """A one-tensor op (its argument is `self` or `x` depending on the schema)."""

    def deco(fn):
        lower(name, promote=promote)(lambda *args: fn(*args))
        return fn

    return deco


_unary_x = _unary


# --- gamma family ------------------------------------------------------------


def _digamma(x):
    return jnp.where(x == 0, jnp.copysign(_full(x, jnp.inf), -x), lax.digamma(x))


def _trigamma(x):
    small = x < 0.5
    s = jnp.sin(math.pi * x)
    refl = jnp.where(small, -(math.pi * math.pi) / (s * s), jnp.zeros_like(x))
    y = jnp.where(small, 1 - x, x)
    acc = refl
    for _ in range(6):
        acc = acc + 1 / (y * y)
        y = y + 1
    ixx = 1 / (y * y)
    acc = acc + (1 + 1 / (2 * y) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / y
    return jnp.where(small, -acc, acc)


_ZETA_A = (
    12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
    -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
    1.8152105401943546773e17, -7.1661652561756670113e18,
)
_MACHEP = 1.11022302462515654042e-16


def _zeta(x, q):
    """Hurwitz zeta(x, q) = sum_k (q + k)^-x by Euler-Maclaurin summation, in float64 like
    PyTorch's CPU kernel (its accumulate type), with PyTorch's domain rules."""
    out_dtype = x.dtype
    x, q = jnp.broadcast_arrays(x.astype(jnp.float64), q.astype(jnp.float64))
    qpole = (q <= 0) & (q == jnp.floor(q))
    bad = (x < 1) | (x == 1) | qpole | ((q <= 0) & (x != jnp.floor(x)))
    xs = jnp.where(bad, 2.0, x)
    qs = jnp.where(bad, 1.0, q)
    s0 = jnp.power(qs, -xs)

    def cond(c):
        return jnp.any(c[4])

    def body(c):
        i, a, b, s, active = c
        i2, a2 = i + 1, a + 1.0
        b2 = jnp.power(a2, -xs)
        s2 = s + b2
        conv = (-_MACHEP * s2 < b2) & (b2 < _MACHEP * s2)
        sel = lambda u, v: jnp.where(active, u, v)  # noqa: E731
        more = active & ~conv & ((i2 < 9) | (a2 <= 9.0))
        return sel(i2, i), sel(a2, a), sel(b2, b), sel(s2, s), more

    zeros = jnp.zeros_like(xs)
    init = (jnp.zeros(xs.shape, jnp.int32), qs, zeros, s0, jnp.ones(xs.shape, jnp.bool_))
    _, a, b, s, _ = lax.while_loop(cond, body, init)
    # elements that stopped on convergence keep s; the rest take the Euler-Maclaurin tail
    conv = (-_MACHEP * s < b) & (b < _MACHEP * s)
    w = a
    t_s = s + b * w / (xs - 1.0) - 0.5 * b
    fa = jnp.ones_like(xs)
    k = zeros
    bb = b
    done = jnp.zeros(xs.shape, jnp.bool_)
    for coef in _ZETA_A:
        fa = fa * (xs + k)
        bb = bb / w
        t = fa * bb / coef
        new_s = t_s + t
        t_s = jnp.where(done, t_s, new_s)
        done = done | (jnp.abs(t / new_s) < _MACHEP)
        k = k + 1.0
        fa = fa * (xs + k)
        bb = bb / w
        k = k + 1.0
    r = jnp.where(conv, s, t_s)
    r = jnp.where((q <= 0) & ~qpole & (x != jnp.floor(x)), jnp.nan, r)
    r = jnp.where(qpole, jnp.inf, r)
    r = jnp.where(x < 1, jnp.nan, r)
    r = jnp.where(x == 1, jnp.inf, r)
    r = jnp.where(jnp.isnan(x) | jnp.isnan(q), jnp.nan, r)
    return r.astype(out_dtype)


@lower("polygamma", promote=INT_TO_FLOAT, promote_args=("self",))
def polygamma(n, self):
    x = self
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    sign = 1.0 if n % 2 else -1.0
    return sign * math.exp(math.lgamma(n + 1.0)) * _zeta(jnp.asarray(n + 1.0, x.dtype), x)


@lower("special_zeta", "special_zeta.self_scalar", "special_zeta.other_scalar", promote=INT_TO_FLOAT,
       promote_args=("self", "other"))
def special_zeta(self, other):
    x, q = jnp.broadcast_arrays(self, other)
    return _zeta(x, q)


@lower("igamma", promote=INT_TO_FLOAT)
def igamma(self, other):
    a, x = jnp.broadcast_arrays(self, other)
    return jsp.gammainc(a, x)


@lower("igammac", promote=INT_TO_FLOAT)
def igammac(self, other):
    a, x = jnp.broadcast_arrays(self, other)
    return jsp.gammaincc(a, x)


# --- exponentially scaled Bessel, error functions, entropy --------------------

_unary("special_i0e")(jsp.i0e)
_unary("special_i1")(jsp.i1)
_unary("special_i1e")(jsp.i1e)
_unary("special_erfcx")(jsp.erfcx)
_unary("special_ndtri")(jsp.ndtri)
_unary("special_log_ndtr")(jsp.log_ndtr)


@_unary("special_entr")
def _entr(x):
    r = -x * jnp.log(jnp.where(x > 0, x, jnp.ones_like(x)))
    r = jnp.where(x == 0, jnp.zeros_like(x), r)
    r = jnp.where(x < 0, -jnp.inf, r)
    return jnp.where(jnp.isnan(x), x, r)


# --- Airy and Bessel functions (Cephes, as in Math.h) ------------------------


@_unary_x("special_airy_ai")
def _airy_ai(x):
    t = _AIRY_AI
    # x < -2.09: asymptotic expansion with oscillating phase
    xn = jnp.where(x < -2.09, x, _full(x, -3.0))
    zeta_n = -2.0 * xn * jnp.sqrt(-xn) / 3.0
    z = 1.0 / zeta_n
    zz = z * z
    afn = _polevl(zz, t["AFN"])
    afd = _polevl(zz, t["AFD"])
    agn = _polevl(zz, t["AGN"])
    agd = _polevl(zz, t["AGD"])
    ph = zeta_n + 0.25 * math.pi
    neg = 5.64189583547756286948e-01 / jnp.sqrt(jnp.sqrt(-xn)) * (
        jnp.sin(ph) * (1.0 + zz * afn / afd) - jnp.cos(ph) * (z * agn / agd)
    )
    # x >= 2.09: exponentially decaying rational approximation
    xp = jnp.where(x >= 2.09, x, _full(x, 3.0))
    zeta_p = 2.0 * xp * jnp.sqrt(xp) / 3.0
    an = _polevl(1.0 / zeta_p, t["AN"])
    ad = _polevl(1.0 / zeta_p, t["AD"])
    pos = 5.64189583547756286948e-01 * (an / ad) / (2.0 * jnp.sqrt(jnp.sqrt(xp)) * jnp.exp(zeta_p))
    # |x| small: power series for f and g, until the terms fall under epsilon
    xs = jnp.where((x >= -2.09) & (x < 2.09), x, jnp.zeros_like(x))
    eps = jnp.finfo(x.dtype).eps
    zc = xs * xs * xs

    def body(_, c):
        f, g, m, n, k, active = c
        m2 = m * zc
        k2 = k + 1.0
        m2 = m2 / k2
        n2 = n * zc
        k2 = k2 + 1.0
        n2 = n2 / k2
        m2 = m2 / k2
        f2 = f + m2
        k2 = k2 + 1.0
        n2 = n2 / k2
        g2 = g + n2
        new_active = active & (jnp.abs(m2 / f2) > eps)
        sel = lambda a, b: jnp.where(active, a, b)  # noqa: E731
        return sel(f2, f), sel(g2, g), sel(m2, m), sel(n2, n), sel(k2, k), new_active

    one = jnp.ones_like(xs)
    init = (one, xs, one, xs, one, jnp.ones(jnp.shape(xs), jnp.bool_))
    f, g, *_ = lax.fori_loop(0, 60, body, init)
    ser = 0.355028053887817239260 * f - 0.258819403792806798405 * g
    r = jnp.where(x < -2.09, neg, jnp.where(x >= 2.09, pos, ser))
    r = jnp.where(x > 103.892, jnp.zeros_like(x), r)
    r = jnp.where(jnp.isinf(x), jnp.nan, r)
    return jnp.where(jnp.isnan(x), x, r)


_PIO4 = 0.785398163397448309615660845819875721
_3PIO4 = 2.356194490192344928846982537459627163
_SQ2OPI = 0.797884560802865355879892119868763737
_TWOOPI = 0.636619772367581343075535053490057448


def _bessel_asym(ax, t, shift, sine):
    """The x > 5 asymptotic form shared by J0/J1/Y0/Y1."""
    w = 5.0 / ax
    z = w * w
    pp = _polevl(z, t["PP"]) / _polevl(z, t["PQ"])
    qp = _polevl(z, t["QP"]) / _polevl(z, t["QQ"])
    xn = ax - shift
    if sine:  # Y: p sin + q cos
        r = pp * jnp.sin(xn) + w * qp * jnp.cos(xn)
    else:  # J: p cos - q sin
        r = pp * jnp.cos(xn) - w * qp * jnp.sin(xn)
    return r * _SQ2OPI / jnp.sqrt(ax)


def _j0(x):
    t = _BESSEL_J0
    ax = jnp.abs(x)
    small = jnp.where(ax <= 5.0, ax, jnp.ones_like(ax))
    z = small * small
    near = (z - 5.78318596294678452118e00) * (z - 3.04712623436620863991e01) * _polevl(z, t["RP"]) / _polevl(
        z, t["RQ"]
    )
    near = jnp.where(small < 0.00001, 1.0 - z / 4.0, near)
    big = jnp.where(ax > 5.0, ax, _full(ax, 6.0))
    far = _bessel_asym(big, t, _PIO4, False)
    return jnp.where(ax <= 5.0, near, jnp.where(jnp.isnan(ax), ax, far))


def _j1(x):
    t = _BESSEL_J1
    ax = jnp.abs(x)
    small = jnp.where(ax <= 5.0, ax, jnp.ones_like(ax))
    z = small * small
    near = _polevl(z, t["RP"]) / _polevl(z, t["RQ"]) * small * (z - 1.46819706421238932572e01) * (
        z - 4.92184563216946036703e01
    )
    big = jnp.where(ax > 5.0, ax, _full(ax, 6.0))
    far = _bessel_asym(big, t, _3PIO4, False)
    r = jnp.where(ax <= 5.0, near, jnp.where(jnp.isnan(ax), ax, far))
    return jnp.where(x < 0, -r, r)


def _y0(x):
    t = _BESSEL_Y0
    small = jnp.where((x <= 5.0) & (x > 0), x, jnp.ones_like(x))
    z = small * small
    near = _polevl(z, t["YP"]) / _polevl(z, t["YQ"]) + _TWOOPI * jnp.log(small) * _j0(small)
    near = jnp.where(x == 0, -jnp.inf, jnp.where(x < 0, jnp.nan, near))
    big = jnp.where(x > 5.0, x, _full(x, 6.0))
    far = _bessel_asym(big, t, _PIO4, True)
    return jnp.where(x <= 5.0, near, jnp.where(jnp.isnan(x), x, far))


def _y1(x):
    t = _BESSEL_Y1
    small = jnp.where((x <= 5.0) & (x > 0), x, jnp.ones_like(x))
    z = small * small
    near = small * (_polevl(z, t["YP"]) / _polevl(z, t["YQ"])) + _TWOOPI * (
        _j1(small) * jnp.log(small) - 1.0 / small
    )
    near = jnp.where(x == 0, -jnp.inf, jnp.where(x < 0, jnp.nan, near))
    big = jnp.where(x > 5.0, x, _full(x, 6.0))
    far = _bessel_asym(big, t, _3PIO4, True)
    return jnp.where(x <= 5.0, near, jnp.where(jnp.isnan(x), x, far))


_unary_x("special_bessel_j0")(_j0)
_unary_x("special_bessel_j1")(_j1)
_unary_x("special_bessel_y0")(_y0)
_unary_x("special_bessel_y1")(_y1)
_unary_x("special_modified_bessel_i0")(jsp.i0)
_unary_x("special_modified_bessel_i1")(jsp.i1)


def _k_parts(x, t, order):
    """(near, far_scaled) for K0/K1: near is K(x) for x <= 2, far_scaled is e^x K(x) for x > 2."""
    small = jnp.where((x <= 2.0) & (x > 0), x, jnp.ones_like(x))
    a = _chbevl(small * small - 2.0, t["A"])
    if order == 0:
        near = a - jnp.log(0.5 * small) * jsp.i0(small)
    else:
        near = jnp.log(0.5 * small) * jsp.i1(small) + a / small
    big = jnp.where(x > 2.0, x, _full(x, 3.0))
    far = _chbevl(8.0 / big - 2.0, t["B"]) / jnp.sqrt(big)
    return small, near, big, far


def _k_finish(x, r):
    r = jnp.where(x == 0, jnp.inf, r)
    r = jnp.where(x < 0, jnp.nan, r)
    return jnp.where(jnp.isnan(x), x, r)


def _k(order, scaled):
    t = _MODIFIED_BESSEL_K0 if order == 0 else _MODIFIED_BESSEL_K1

    def fn(x):
        small, near, big, far = _k_parts(x, t, order)
        if scaled:
            near = near * jnp.exp(small)
        else:
            far = jnp.exp(-big) * far
        return _k_finish(x, jnp.where(x <= 2.0, near, far))

    return fn


_unary_x("special_modified_bessel_k0")(_k(0, False))
_unary_x("special_modified_bessel_k1")(_k(1, False))
_unary_x("special_scaled_modified_bessel_k0")(_k(0, True))
_unary_x("special_scaled_modified_bessel_k1")(_k(1, True))


@_unary_x("special_spherical_bessel_j0")
def _spherical_j0(x):
    z = x * x
    series = 1.0 + z * (-1.0 / 6.0 + z * (1.0 / 120.0 + z * (-1.0 / 5040.0 + z * (
        1.0 / 362880.0 + z * (-1.0 / 39916800.0 + z * (1.0 / 6227020800.0))))))
    safe = jnp.where(jnp.abs(x) < 0.5, jnp.ones_like(x), x)
    r = jnp.where(jnp.abs(x) < 0.5, series, jnp.sin(safe) / safe)
    return jnp.where(jnp.isinf(x), jnp.zeros_like(x), r)


# --- orthogonal polynomials --------------------------------------------------


def _degree(n):
    """PyTorch casts the (promoted, floating) degree to int64; non-finite -> negative."""
    ok = jnp.isfinite(n)
    return jnp.where(ok, jnp.trunc(jnp.where(ok, n, 0)), -1).astype(jnp.int64)


def _recur(x, n, p0, q0, step, first_k, active):
    """Run r_{k} = step(k, p, q) for k = first_k .. n (elementwise n) where `active`;
    returns q after the last step. Elements stop once their q is NaN (as PyTorch does)."""
    top = jnp.max(jnp.where(active, n, 0), initial=0)

    def cond(c):
        return c[0] <= top

    def body(c):
        k, p, q = c
        go = active & (k <= n) & ~jnp.isnan(q)
        r = step(k.astype(x.dtype), p, q)
        return k + 1, jnp.where(go, q, p), jnp.where(go, r, q)

    _, _, q = lax.while_loop(cond, body, (jnp.asarray(first_k, jnp.int64), p0, q0))
    return q


def _cheb(kind, shifted):
    """Chebyshev polynomials of the first..fourth kind (T, U, V, W), plain or shifted."""

    def fn(x, n):
        x, n = jnp.broadcast_arrays(x, n)
        n = _degree(n)
        nf = n.astype(x.dtype)
        y = x + x - 1.0 if shifted else x
        one = jnp.ones_like(x)
        odd = (n % 2) != 0
        if shifted:
            at_pos, at_neg = x == 1.0, x == 0.0
        else:
            at_pos, at_neg = (jnp.abs(x) == 1.0) & (x > 0), (jnp.abs(x) == 1.0) & ~(x > 0)
        inside = jnp.abs(y) < 1.0
        ysafe = jnp.where(inside, y, jnp.zeros_like(y))
        th = jnp.arccos(ysafe)
        if kind == "t":
            q1 = y
            pos_v, neg_v = one, jnp.where(odd, -one, one)
            trig_n = 6
            trig = jnp.cos(nf * th)
        elif kind == "u":
            q1 = y + y
            pos_v, neg_v = nf + 1, jnp.where(odd, -(nf + 1), nf + 1)
            trig_n = 6 if shifted else 8
            s = jnp.sin(th)
            trig = jnp.where(
                s != 0,
                jnp.sin((nf + 1) * th) / jnp.where(s != 0, s, one),
                (nf + 1) * jnp.cos((nf + 1) * th) / ysafe,
            )
        elif kind == "v":
            q1 = y + y - 1.0
            pos_v, neg_v = one, jnp.where(odd, -(nf + nf + 1), nf + nf + 1)
            trig_n = 6 if shifted else 8
            c = jnp.sin(th / 2.0) != 1.0
            trig = jnp.where(c, jnp.cos((nf + 0.5) * th) / jnp.cos(th / 2.0), neg_v)
        else:
            q1 = y + y + 1.0
            pos_v, neg_v = nf + nf + 1, jnp.where(odd, -one, one)
            trig_n = 4 if shifted else 8
            c = jnp.cos(th / 2.0) != 1.0
            sh = jnp.sin(th / 2.0)
            edge = pos_v if not shifted else neg_v
            if not shifted:
                edge = jnp.where(x > 0, pos_v, neg_v)
            trig = jnp.where(c, jnp.sin((nf + 0.5) * th) / jnp.where(c, sh, one), edge)
        use_trig = (n > trig_n) & inside
        plain = (n >= 2) & ~use_trig & ~at_pos & ~at_neg
        rec = _recur(x, n, one, q1, lambda k, p, q: (y + y) * q - p, 2, plain)
        r = rec
        r = jnp.where(n == 1, q1, r)
        r = jnp.where(n == 0, one, r)
        r = jnp.where(use_trig, trig, r)
        r = jnp.where(at_neg, neg_v, r)
        r = jnp.where(at_pos, pos_v, r)
        return jnp.where(n < 0, jnp.zeros_like(x), r)

    return fn


def _hermite_h(x, n):
    x, n = jnp.broadcast_arrays(x, n)
    n = _degree(n)
    one = jnp.ones_like(x)
    limit = 128 if jnp.dtype(x.dtype) == jnp.float32 else 512
    plain = (n >= 2) & (n <= limit)
    # the k-th step (k = 2 .. n) computes H_k = 2x H_{k-1} - 2(k-1) H_{k-2}
    rec = _recur(x, n, one, x + x, lambda k, p, q: (x + x) * q - (k + k - 2.0) * p, 2, plain)
    r = jnp.where(n > limit, jnp.nan, rec)
    r = jnp.where(n == 1, x + x, r)
    r = jnp.where(n == 0, one, r)
    return jnp.where(n < 0, jnp.zeros_like(x), r)


def _hermite_he(x, n):
    x, n = jnp.broadcast_arrays(x, n)
    n = _degree(n)
    one = jnp.ones_like(x)
    limit = 128 if jnp.dtype(x.dtype) == jnp.float32 else 512
    plain = (n >= 2) & (n <= limit)
    rec = _recur(x, n, one, x, lambda k, p, q: x * q - (k - 1.0) * p, 2, plain)
    r = jnp.where(n > limit, jnp.nan, rec)
    r = jnp.where(n == 1, x, r)
    r = jnp.where(n == 0, one, r)
    return jnp.where(n < 0, jnp.zeros_like(x), r)


def _laguerre(x, n):
    x, n = jnp.broadcast_arrays(x, n)
    n = _degree(n)
    one = jnp.ones_like(x)
    plain = (n >= 2) & (x != 0)
    # step j = k-1: L_k = ((2j + 1 - x) L_{k-1} - j L_{k-2}) / (j + 1)
    rec = _recur(x, n, one, 1.0 - x, lambda k, p, q: (((k + k - 2.0) + (1.0 - x)) * q - (k - 1.0) * p) / k, 2,
                 plain)
    r = jnp.where(n == 1, 1.0 - x, rec)
    r = jnp.where((n == 0) | (x == 0), one, r)
    return jnp.where(n < 0, jnp.zeros_like(x), r)


def _legendre(x, n):
    x, n = jnp.broadcast_arrays(x, n)
    n = _degree(n)
    one = jnp.ones_like(x)
    at1 = jnp.abs(x) == 1.0
    plain = (n >= 2) & ~at1
    rec = _recur(x, n, one, x, lambda k, p, q: ((k + k - 1.0) * x * q - (k - 1.0) * p) / k, 2, plain)
    r = jnp.where(n == 1, x, rec)
    r = jnp.where(n == 0, one, r)
    r = jnp.where(at1, jnp.where((x > 0) | (n % 2 == 0), one, -one), r)
    return jnp.where(n < 0, jnp.zeros_like(x), r)


def _poly(base, fn):
    lower(base, base + ".x_scalar", base + ".n_scalar", promote=INT_TO_FLOAT, promote_args=("x", "n"))(
        lambda x, n: fn(x, n)
    )


for _k_, _s in (("t", False), ("u", False), ("v", False), ("w", False)):
    _poly("special_chebyshev_polynomial_" + _k_, _cheb(_k_, False))
    _poly("special_shifted_chebyshev_polynomial_" + _k_, _cheb(_k_, True))
_poly("special_hermite_polynomial_h", _hermite_h)
_poly("special_hermite_polynomial_he", _hermite_he)
_poly("special_laguerre_polynomial_l", _laguerre)
_poly("special_legendre_polynomial_p", _legendre)


# --- integer and complex odds and ends ---------------------------------------


@lower("gcd", promote=DEFAULT)
def gcd(self, other):
    a, b = jnp.broadcast_arrays(self, other)
    return jnp.gcd(a, b)


@lower("lcm", promote=DEFAULT)
def lcm(self, other):
    a, b = jnp.broadcast_arrays(self, other)
    g = jnp.gcd(a, b)
    safe = jnp.where(g == 0, jnp.ones_like(g), g)
    return jnp.where(g == 0, jnp.zeros_like(a), jnp.abs(a // safe * b))


@lower("angle")
def angle(self):
    if jnp.issubdtype(self.dtype, jnp.complexfloating):
        return jnp.angle(self)
    x = self
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(to_jax_dtype(torch.get_default_dtype()))
    r = jnp.where(x < 0, jnp.asarray(math.pi, x.dtype), jnp.zeros_like(x))
    return jnp.where(jnp.isnan(x), x, r)


@lower("complex")
def complex_(real, imag):
    if jnp.dtype(real.dtype) == jnp.float16:
        raise TypeError("torchtpu: complex32 (chalf) results are not supported on the tpu device")
    re, im = jnp.broadcast_arrays(real, imag)
    return lax.complex(re, im)


@lower("polar")
def polar(abs, angle):  # noqa: A002 - schema names
    r, t = jnp.broadcast_arrays(abs, angle)
    return lax.complex(r * jnp.cos(t), r * jnp.sin(t))


_FREXP_BITS = {
    jnp.dtype(jnp.float32): (jnp.uint32, 32, 23, -126),
    jnp.dtype(jnp.float64): (jnp.uint64, 64, 52, -1022),
}


@lower("frexp.Tensor")
def frexp(self):
    x = self
    low = jnp.dtype(x.dtype) in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
    if low:
        x = x.astype(jnp.float32)
    m, e = jnp.frexp(x)
    # XLA:CPU flushes subnormals to zero in arithmetic; split them from the bits instead
    ut, width, nmant, min_exp = _FREXP_BITS[jnp.dtype(x.dtype)]
    bits = lax.bitcast_convert_type(x, ut)
    mask = (1 << nmant) - 1
    frac = bits & ut(mask)
    sub = ((bits >> nmant) & ut((1 << (width - 1 - nmant)) - 1)) == 0
    sub = sub & (frac != 0)
    p = (width - 1) - lax.clz(frac).astype(jnp.int32)
    shift = jnp.clip(nmant - p, 0, nmant).astype(ut)
    bias = -min_exp + 1
    sign = bits & ut(1 << (width - 1))
    mbits = sign | ut((bias - 1) << nmant) | ((frac << shift) & ut(mask))
    sub_m = lax.bitcast_convert_type(mbits, x.dtype)
    sub_e = p + 1 + min_exp - nmant
    m = jnp.where(sub, sub_m, m)
    e = jnp.where(sub, sub_e, e)
    fin = jnp.isfinite(x)
    m = jnp.where(fin, m, x)
    e = jnp.where(fin, e, 0)
    return m.astype(self.dtype), e.astype(jnp.int32)


@lower("renorm", static=("p",))
def renorm(self, p, dim, maxnorm):
    x = self
    nd = x.ndim
    dim = dim + nd if dim < 0 else dim
    axes = tuple(d for d in range(nd) if d != dim)
    acc = x.astype(jnp.float32) if jnp.dtype(x.dtype) in (jnp.float16, jnp.bfloat16) else x
    a = jnp.abs(acc)
    p = float(p)
    if p == math.inf:
        norm = jnp.max(a, axis=axes, keepdims=True, initial=0)
    elif p == -math.inf:
        norm = jnp.min(a, axis=axes, keepdims=True, initial=jnp.inf)
    elif p == 0:
        norm = jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=True)
    elif p == 1:
        norm = jnp.sum(a, axis=axes, keepdims=True)
    elif p == 2:
        norm = jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=True))
    else:
        norm = jnp.sum(a ** p, axis=axes, keepdims=True) ** (1.0 / p)
    maxnorm = jnp.asarray(maxnorm, norm.dtype)
    factor = jnp.where(norm > maxnorm, maxnorm / (norm + 1e-7), jnp.ones_like(norm))
    return (acc * factor).astype(x.dtype)


# --- membership and sorted search ------------------------------------------------


def _common(a, b):
    (a2, b2), _ = _promote(DEFAULT, a, b)
    return a2, b2


def _isin(elements, test_elements, invert):
    e, t = _common(elements, test_elements)
    t = t.reshape(-1)
    if t.size == 0:
        found = jnp.zeros(e.shape, jnp.bool_)
    elif t.size <= 64:
        found = jnp.any(e[..., None] == t, axis=-1)
    else:
        st = jnp.sort(t)
        idx = jnp.clip(jnp.searchsorted(st, e, side="left"), 0, st.size - 1)
        found = st[idx] == e
    return ~found if invert else found


@lower("isin.Tensor_Tensor")
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    return _isin(elements, test_elements, invert)


@lower("isin.Tensor_Scalar")
def isin_tensor_scalar(elements, test_element, *, assume_unique=False, invert=False):
    return _isin(elements, test_element, invert)


@lower("isin.Scalar_Tensor")
def isin_scalar_tensor(element, test_elements, *, assume_unique=False, invert=False):
    return _isin(element, test_elements, invert)


def _search(seq, vals, right, out_int32, sorter=None):
    """PyTorch's binary search, as counts: left = #{s : !(s >= v)}, right = #{s : !(s > v)}
    (so a NaN value lands past the end, as in PyTorch)."""
    seq, vals = _common(seq, vals)
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter.astype(jnp.int64), axis=-1)
    m = seq.shape[-1] if seq.ndim else 1
    if seq.ndim <= 1:
        seq1 = seq.reshape(-1)
        if m * max(vals.size, 1) <= (1 << 22):
            v = vals[..., None]
            hit = ~(seq1 > v) if right else ~(seq1 >= v)
            r = jnp.sum(hit, axis=-1)
        else:
            r = jnp.searchsorted(seq1, vals, side="right" if right else "left")
    else:
        hit = ~(seq[..., None, :] > vals[..., :, None]) if right else ~(seq[..., None, :] >= vals[..., :, None])
        r = jnp.sum(hit, axis=-1)
    return r.astype(jnp.int32 if out_int32 else jnp.int64)


@lower("searchsorted.Tensor", "searchsorted.Scalar")
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    if side is not None:
        right = side == "right"
    return _search(sorted_sequence, self, right, out_int32, sorter)


@lower("bucketize.Tensor", "bucketize.Scalar")
def bucketize(self, boundaries, *, out_int32=False, right=False):
    if boundaries.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")
    return _search(boundaries, self, right, out_int32)


# --- histograms --------------------------------------------------------------


def _linspace(lo, hi, steps, dtype):
    """PyTorch's CPU linspace: the first half counts up from `lo`, the second down from `hi`."""
    lo = jnp.asarray(lo, dtype)
    hi = jnp.asarray(hi, dtype)
    if steps == 1:
        return lo.reshape(1)
    step = (hi - lo) / (steps - 1)
    i = jnp.arange(steps, dtype=jnp.int64)
    half = steps // 2
    up = lo + step * i.astype(dtype)
    down = hi - step * (steps - 1 - i).astype(dtype)
    return jnp.where(i < half, up, down)


def _outer_edges(x, lo, hi, widen):
    """(leftmost, rightmost) per column of x (N, D): from the data when lo == hi is not given."""
    if x.shape[0] > 0:
        mn = jnp.min(x, axis=0)
        mx = jnp.max(x, axis=0)
    else:
        mn = mx = jnp.zeros(x.shape[1:], x.dtype)
    if lo is None:
        lo, hi = mn, mx
    lo = jnp.broadcast_to(jnp.asarray(lo, x.dtype), x.shape[1:])
    hi = jnp.broadcast_to(jnp.asarray(hi, x.dtype), x.shape[1:])
    same = lo == hi
    return jnp.where(same, lo - widen, lo), jnp.where(same, hi + widen, hi)


def _bin_index(x, edges, linear):
    """Bin of each element of x (1-D) for increasing `edges`; -1 when outside / NaN."""
    nb = edges.shape[0] - 1
    left, right = edges[0], edges[-1]
    inside = (x >= left) & (x <= right)
    if linear:
        pos = ((x - left) * nb / (right - left))
        pos = jnp.where(inside, pos, 0).astype(jnp.int64)
    else:
        pos = jnp.sum(~(edges[None, :] > x[:, None]), axis=-1) - 1
    pos = jnp.where(pos == nb, nb - 1, pos)
    pos = jnp.clip(pos, 0, max(nb - 1, 0))
    return jnp.where(inside, pos, -1)


def _histdd(x, edges, weight, density, linear=False):
    """x: (N, D); edges: D increasing 1-D arrays. Returns the D-dimensional histogram."""
    shape = tuple(e.shape[0] - 1 for e in edges)
    n = x.shape[0]
    flat = jnp.zeros((n,), jnp.int64)
    ok = jnp.ones((n,), jnp.bool_)
    for d, e in enumerate(edges):
        b = _bin_index(x[:, d], e, linear)
        ok = ok & (b >= 0)
        flat = flat * shape[d] + jnp.maximum(b, 0)
    w = jnp.ones((n,), x.dtype) if weight is None else weight.reshape(-1).astype(x.dtype)
    w = jnp.where(ok, w, jnp.zeros_like(w))
    size = math.prod(shape)
    hist = jnp.zeros((size,), x.dtype).at[flat].add(w, mode="drop").reshape(shape)
    if density:
        total = jnp.sum(hist)
        hist = hist / total
        for d, e in enumerate(edges):
            widths = e[1:] - e[:-1]
            sh = [1] * len(edges)
            sh[d] = widths.shape[0]
            hist = hist / widths.reshape(sh)
    return hist


def _ranges(x, bins, range_):
    d = x.shape[1]
    if len(bins) != d:
        raise RuntimeError("histogramdd: The size of bins must be equal to the innermost dimension of the input.")
    if range_ is not None:
        lo = jnp.asarray([range_[2 * i] for i in range(d)], x.dtype)
        hi = jnp.asarray([range_[2 * i + 1] for i in range(d)], x.dtype)
        lo, hi = _outer_edges(x, lo, hi, 0.5)
    else:
        lo, hi = _outer_edges(x, None, None, 0.5)
    return [_linspace(lo[i], hi[i], bins[i] + 1, x.dtype) for i in range(d)]


@lower("histc")
def histc(self, bins=100, min=0, max=0):  # noqa: A002 - schema names
    x = self.reshape(-1, 1)
    lo = jnp.asarray(min, x.dtype)
    hi = jnp.asarray(max, x.dtype)
    if x.shape[0] > 0:
        given = lo != hi
        lo = jnp.where(given, lo, jnp.min(x))
        hi = jnp.where(given, hi, jnp.max(x))
    lo, hi = _outer_edges(x, lo, hi, 1.0)
    edges = _linspace(lo[0], hi[0], bins + 1, x.dtype)
    return _histdd(x, [edges], None, False, linear=True)


@lower("histogram.bin_ct")
def histogram_bin_ct(self, bins=100, *, range=None, weight=None, density=False):  # noqa: A002
    x = self.reshape(-1, 1)
    edges = _ranges(x, [bins], range)
    return _histdd(x, edges, weight, density), edges[0]


@lower("histogram.bins_tensor")
def histogram_bins_tensor(self, bins, *, weight=None, density=False):
    x = self.reshape(-1, 1)
    edges = bins.astype(x.dtype)
    return _histdd(x, [edges], weight, density), bins


@lower("_histogramdd_bin_edges")
def _histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):  # noqa: A002
    x = self.reshape(-1, self.shape[-1])
    return list(_ranges(x, list(bins), range))


@lower("_histogramdd_from_bin_cts")
def _histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):  # noqa: A002
    x = self.reshape(-1, self.shape[-1])
    edges = _ranges(x, list(bins), range)
    return _histdd(x, edges, weight, density)


@lower("_histogramdd_from_bin_tensors")
def _histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
    x = self.reshape(-1, self.shape[-1])
    return _histdd(x, [b.astype(x.dtype) for b in bins], weight, density)


# --- kernels: data-dependent sizes, host-visible results ---------------------


@jax.jit
def _max_or_neg1(v):
    return jnp.max(v.reshape(-1).astype(jnp.int64), initial=-1)


@jax.jit
def _all_equal(a, b):
    return jnp.all(a == b)


def _bincount_fn(self, weights, size):
    if weights is None:
        return jnp.zeros((size,), jnp.int64).at[self].add(1, mode="drop")
    wdt = jnp.float32 if jnp.dtype(weights.dtype) == jnp.float32 else jnp.float64
    return jnp.zeros((size,), wdt).at[self].add(weights.astype(wdt), mode="drop")


_bincount_jit = jax.jit(_bincount_fn, static_argnums=(2,))


@kernel("bincount")
def bincount(self, weights=None, minlength=0):
    from ..runtime import tensors, transfer

    if self.dim() != 1:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if self.dtype.is_floating_point or self.dtype.is_complex or self.dtype == torch.bool:
        raise NotImplementedError(f"\"bincount_cpu\" not implemented for '{scalar_type_name(self.dtype)}'")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if weights is not None and weights.shape != self.shape:
        raise RuntimeError("weights should be 1-d and have the same length as input")
    v = transfer.value(self)
    sync_debug.host_sync()  # (the result's size is the data's maximum)
    top = int(_max_or_neg1(v)) if self.numel() else -1
    if self.numel() and int(jnp.min(v)) < 0:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    size = builtins_max(top + 1, int(minlength))
    w = transfer.value(weights) if weights is not None else None
    out = _bincount_jit(v, w, size)
    if weights is None:
        dt = torch.int64
    else:
        dt = torch.float32 if weights.dtype == torch.float32 else torch.float64
    return tensors.empty((size,), dt, out.reshape(-1))


@kernel("equal")
def equal(self, other):
    from ..runtime import transfer

    if self.device.type != other.device.type:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"{self.device} and {other.device}!"
        )
    if self.shape != other.shape:
        return False
    if self.numel() == 0:
        return True
    a, b = transfer.value(self), transfer.value(other)
    if a.dtype != b.dtype:
        dt = jnp.promote_types(a.dtype, b.dtype)
        a, b = a.astype(dt), b.astype(dt)
    sync_debug.host_sync()
    return bool(_all_equal(a, b))


builtins_max = max
