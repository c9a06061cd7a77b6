"""Throwaway float64 check of the sparse second-order identities (docs/sparse_second_order.md).

Dense references are written from the paper formulas (SON Alg. 1 + Alg. 3 + eq. 4; Ada-FD Alg.
1/2 with an FD sketch, RFD paper Alg. 1; RP-SON sec. 3); the sparse versions use only
O(m^2 + m s) work per step on their fast paths (the Python loops touch Z only at the example's
support, except the counted FD slot-freeing fallback). Reports max relative errors of
predictions and weights.
"""

import numpy as np

DECOMPOSE = "chol"
COND_MAX = 1e6
ALPHA = 30.0
FD_COND = 1e8

d, m, T = 30, 4, 400
rng = np.random.default_rng(0)
wstar = rng.normal(size=d)


def make_stream(seed):
    r = np.random.default_rng(seed)
    fresh = list(range(20, 30))  # coordinates used at most once ("never recur")
    r.shuffle(fresh)
    xs = []
    for t in range(T):
        s = int(r.integers(1, 8)) if t % 50 else d  # s from 1 to d
        idx = set(r.choice(20, size=min(s, 20), replace=False).tolist())  # recurring coords
        if s == d:
            idx = set(range(d))
        elif fresh and r.random() < 0.1:
            idx.add(fresh.pop())
        idx = np.array(sorted(idx))
        xs.append((idx, r.normal(size=idx.size) * r.choice([0.3, 1.0, 3.0], size=idx.size)))
    return xs


def dense(idx, val):
    x = np.zeros(d)
    x[idx] = val
    return x


def rel(a, b):
    return np.max(np.abs(a - b)) / max(1e-300, np.max(np.abs(b)))


def tau_c(y, c):
    return np.sign(y) * max(abs(y) - c, 0.0)


# ---------------------------------------------------------------------------------- Oja-SON
def oja_dense(xs, alpha, C, sig_eta, gammas, V0):
    V, lam, u, t = V0.copy(), np.zeros(m), np.zeros(d), 0
    preds, ws = [], []
    for idx, val in xs:
        x = dense(idx, val)
        # projection (Alg. 1 line 5, Lemma 1) with the sketch of t-1 = current t rounds
        S = np.sqrt(t * lam)[:, None] * V
        H = 1.0 / (alpha + t * lam)
        xh = S @ x
        gam = tau_c(u @ x, C) / (x @ x - xh @ (H * xh))
        w = u - gam * (x - S.T @ (H * xh))
        y = w @ x
        preds.append(y)
        ws.append(w.copy())
        label = wstar @ x
        g = (y - label) * x
        gh = np.sqrt(sig_eta) * g
        # Oja (eq. 4), Gamma_t = diag(gammas) / t
        t += 1
        G = gammas / t
        p = V @ gh
        lam = (1 - G) * lam + G * p**2
        Vn = V + (G * p)[:, None] * gh[None, :]
        q, r = np.linalg.qr(Vn.T)  # Gram-Schmidt of the rows, positive diagonal
        V = (q * np.sign(np.diag(r))).T
        S = np.sqrt(t * lam)[:, None] * V
        H = 1.0 / (alpha + t * lam)
        u = w - (g - S.T @ (H * (S @ g))) / alpha  # Alg. 1 line 9
    return np.array(preds), np.array(ws)


def oja_sparse(xs, alpha, C, sig_eta, gammas, V0):
    Z = V0.copy()  # m x d, touched only at supp(x)
    F, K = np.eye(m), V0 @ V0.T
    lam, ubar, b, t = np.zeros(m), np.zeros(d), np.zeros(m), 0
    preds, ws = [], []
    remat = [0]
    for idx, val in xs:
        Zx = Z[:, idx] @ val  # O(ms)
        xx = val @ val
        xh = F @ Zx
        H = 1.0 / (alpha + t * lam)
        gam = tau_c(ubar[idx] @ val + b @ Zx, C) / (xx - t * xh @ (lam * H * xh))  # Alg. 4 step 5
        wbar = ubar  # in place: only supp(x) changes
        wbar[idx] -= gam * val
        b = b + gam * t * F.T @ (lam * H * xh)
        y = wbar[idx] @ val + b @ Zx  # step 6
        preds.append(y)
        ws.append(wbar + Z.T @ b)  # O(md), for the check only
        label = wstar[idx] @ val
        gv = (y - label) * val  # g on supp(x)
        ghv = np.sqrt(sig_eta) * gv
        # Alg. 5
        t += 1
        G = gammas / t
        zg = Z[:, idx] @ ghv  # Z_{t-1} ghat
        p = F @ zg
        lam = (1 - G) * lam + G * p**2
        delta = np.linalg.solve(F, G * p)  # A = F (lower triangular: O(m^2) solve)
        gg = ghv @ ghv
        K = K + np.outer(delta, zg) + np.outer(zg, delta) + gg * np.outer(delta, delta)
        Z[:, idx] += np.outer(delta, ghv)  # O(ms)
        if DECOMPOSE == "chol":
            L = np.linalg.cholesky(F @ K @ F.T)  # Decompose: L L^T = F K F^T
        else:  # QR of M^T, M = [I + c p^T, rho c] (F Z_{t-1} orthonormal; no K needed)
            c = G * p
            rho = np.sqrt(max(gg - p @ p, 0.0))
            Mt = np.vstack([np.eye(m) + np.outer(p, c), rho * c[None, :]])
            R = np.linalg.qr(Mt)[1]
            L = (R * np.sign(np.diag(R))[:, None]).T
        F = np.linalg.solve(L, F)  # Q = L^{-1} F, lower triangular
        H = 1.0 / (alpha + t * lam)
        # Alg. 4 step 9 (eq. 5)
        wbar[idx] -= gv / alpha + (delta @ b) * ghv
        ubar = wbar
        b = b + t * F.T @ (lam * H * (F @ (Z[:, idx] @ gv))) / alpha
        if np.linalg.cond(F) > COND_MAX:  # re-materialize, O(m^2 d): w = wbar + Z^T b unchanged
            b = np.linalg.solve(F.T, b)  # Z^T b = (F Z)^T F^{-T} b
            Z[:] = F @ Z
            K = Z @ Z.T  # = I up to rounding (or set K = I)
            F = np.eye(m)
            remat[0] += 1
    orth = np.max(np.abs((F @ Z) @ (F @ Z).T - np.eye(m)))
    kerr = np.max(np.abs(K - Z @ Z.T))
    return np.array(preds), np.array(ws), orth, kerr, remat[0]


# ---------------------------------------------------------------------------------- FD (dense)
def fd_dense_step(B, g):
    B = B.copy()
    B[-1] = g  # the last row is the free slot
    Gm = B @ B.T
    mu, U = np.linalg.eigh(Gm)
    mu, U = mu[::-1], U[:, ::-1]
    lam = np.maximum(mu - mu[-1], 0)
    D = np.where(mu > 0, np.sqrt(lam / np.where(mu > 0, mu, 1)), 0)
    return (D[:, None] * U.T) @ B


def adafd_dense(xs, eta, dlt, rule):
    B, x1 = np.zeros((m, d)), np.zeros(d)
    w, gsum = x1.copy(), np.zeros(d)
    preds, ws = [], []
    for idx, val in xs:
        x = dense(idx, val)
        y = w @ x
        preds.append(y)
        ws.append(w.copy())
        g = (y - wstar @ x) * x
        B = fd_dense_step(B, g)
        _, sv, Vt = np.linalg.svd(B, full_matrices=False)
        keep = sv > 1e-12 * max(1.0, sv.max(initial=0))
        sv, Vt = sv[keep], Vt[keep]

        def hinv(v, sv=sv, Vt=Vt):  # (delta I + (B^T B)^{1/2})^{-1} v
            return v / dlt - Vt.T @ ((sv / (dlt * (dlt + sv))) * (Vt @ v))

        if rule == "md":
            w = w - eta * hinv(g)  # Ada-FD Alg. 2, no regularizer
        else:
            gsum += g
            w = x1 - eta * hinv(gsum)  # Ada-FD Alg. 1, no regularizer
    return np.array(preds), np.array(ws)


class SparseFD:
    """B = F Z (F m x m, Z m x d), K = Z Z^T. Fast path: Z += delta g^T (O(ms + m^3));
    fallback: free a row of Z by a rank-one update (O(m d)), then write g into it."""

    def __init__(self):
        self.Z, self.F, self.K = np.zeros((m, d)), np.zeros((m, m)), np.zeros((m, m))
        self.free = list(range(m))
        self.fallbacks = 0
        self.fast = 0
        self.remat = 0

    def absorb(self, idx, g, hooks):
        F, Z, K = self.F, self.Z, self.K
        self.written = None
        zg = Z[:, idx] @ g
        gg = g @ g
        if self.free:  # write g into a zero row k of Z: O(s)
            k = self.free.pop(0)
            self.written = k
            Z[k, idx] = g
            K[k, :] = K[:, k] = Z[:, idx] @ g
            F[:, k] = 0
            F[-1, k] = 1.0  # B's last row := g
            Gm = F @ K @ F.T
            mode = ("slot", k)
        else:
            fz = F @ zg
            Gm = F @ K @ F.T
            Gm[-1, :] += fz
            Gm[:, -1] += fz
            Gm[-1, -1] += gg
            mode = ("rank1",)
        mu, U = np.linalg.eigh(Gm)
        mu, U = mu[::-1], U[:, ::-1]
        lam = np.maximum(mu - mu[-1], 0)
        D = np.where(mu > 0, np.sqrt(lam / np.where(mu > 0, mu, 1)), 0)
        N = D[:, None] * U.T
        if mode[0] == "rank1":
            F1 = N @ F
            rhs = N[:, -1]
            delta, *_ = np.linalg.lstsq(F1, rhs, rcond=None)
            res = np.linalg.norm(F1 @ delta - rhs)
            ok = res <= 1e-11 * max(1.0, np.linalg.norm(rhs)) and np.linalg.norm(delta) < 1e6
            if ok:
                self.fast += 1
                hooks["z_plus"](delta, idx, g)  # weights: wbar -= (delta.b) g before Z changes
                K += np.outer(delta, zg) + np.outer(zg, delta) + gg * np.outer(delta, delta)
                Z[:, idx] += np.outer(delta, g)
                self.F = F1
                if np.linalg.cond(K) > FD_COND:  # re-materialize B = F Z: O(m^2 d), rare
                    self.remat += 1
                    Bn = self.F @ self.Z
                    hooks["fold"](Bn)
                    self.Z[:] = Bn
                    self.Z[-1] = 0
                    self.F = np.diag(np.r_[np.ones(m - 1), 0.0])
                    self.K = self.Z @ self.Z.T
                    self.free = [m - 1]
                return lam
            # fallback: free a slot (rank-one update of Z, O(m d)) and redo as a slot write
            self.fallbacks += 1
            _, _, vt = np.linalg.svd(F[:-1])  # F's last row is zero: rank <= m-1
            v = vt[-1]
            k = int(np.argmax(np.abs(v)))
            h = v / v[k]
            hooks["free"](k, h)  # weights: wbar += (b.h) z_k ; b_k = 0
            E = np.eye(m) - np.outer(h, np.eye(m)[k])  # Z' = E Z with E = I - h e_k^T
            self.Z[:] = E @ Z
            self.Z[k] = 0
            self.K[:] = E @ K @ E.T
            self.K[k, :] = self.K[:, k] = 0
            self.F[:, k] = 0
            self.free.append(k)
            return self.absorb(idx, g, hooks)
        self.F = N @ F
        return lam


def adafd_sparse(xs, eta, dlt, rule):
    fd = SparseFD()
    x1 = np.zeros(d)
    wbar, b = x1.copy(), np.zeros(m)  # md: w = wbar + Z^T b
    gsum, p = np.zeros(d), np.zeros(m)  # da: p = Z gsum
    preds, ws = [], []
    st = {"b": b, "p": p}

    def z_plus(delta, idx, g):  # Z += delta g^T
        if rule == "md":
            wbar[idx] -= (delta @ st["b"]) * g
        else:
            st["p"] = st["p"] + delta * (g @ gsum[idx])

    def free(k, h):  # z_j -= h_j z_k (j != k), z_k := 0   [O(m d)]
        if rule == "md":
            wbar[:] += (h @ st["b"]) * fd.Z[k]
            st["b"] = st["b"].copy()
            st["b"][k] = 0
        else:
            st["p"] = st["p"] - h * st["p"][k]
            st["p"][k] = 0

    def fold(Bn):  # w = wbar + Z^T b -> wbar += Z^T b, b = 0 (O(m d))
        wbar[:] += fd.Z.T @ st["b"]
        st["b"] = np.zeros(m)

    hooks = {"z_plus": z_plus, "free": free, "fold": fold}
    for idx, val in xs:
        Zx = fd.Z[:, idx] @ val
        if rule == "md":
            y = wbar[idx] @ val + st["b"] @ Zx
            ws.append(wbar + fd.Z.T @ st["b"])
        else:
            beta = st["beta"] if "beta" in st else np.zeros(m)
            y = wbar[idx] @ val + beta @ Zx
            ws.append(wbar + fd.Z.T @ beta)
        preds.append(y)
        g = (y - wstar[idx] @ val) * val
        k_before = list(fd.free)
        lam = fd.absorb(idx, g, hooks)
        if rule == "da" and k_before:  # a slot write adds z_k = g: p_k = g . gsum (O(s))
            pass
        sv = np.sqrt(lam)
        coef = np.where(lam > 0, sv / (dlt * (dlt + sv)) / np.where(lam > 0, lam, 1), 0)
        F, Z = fd.F, fd.Z
        if rule == "md":
            wbar[idx] -= eta * g / dlt
            st["b"] = st["b"] + eta * F.T @ (coef * (F @ (Z[:, idx] @ g)))
        else:
            gsum[idx] += g
            wbar[idx] -= eta * g / dlt
            # p = Z gsum: recomputed from its O(s) increments; for a slot write the new row's p_k
            # is g . gsum (O(s)); the increment Z g of the new g is O(ms)
            p = st["p"]
            if k_before and len(fd.free) < len(k_before) + 0:
                pass
            st["p"] = p
            st["beta"] = eta * F.T @ (coef * (F @ st["p"]))
    return np.array(preds), np.array(ws), fd


def adafd_sparse_da(xs, eta, dlt):
    """Dual averaging with p = Z gsum maintained incrementally (all O(s) / O(ms) except the
    counted fallback)."""
    fd = SparseFD()
    xbar, gsum, st = np.zeros(d), np.zeros(d), {"p": np.zeros(m), "beta": np.zeros(m)}
    preds, ws = [], []

    def z_plus(delta, idx, g):  # Z += delta g^T: p += delta (g . gsum), gsum before adding g
        st["p"] = st["p"] + delta * (g @ gsum[idx])

    def free(k, h):
        st["p"] = st["p"] - h * st["p"][k]
        st["p"][k] = 0

    def fold(Bn):  # p = Z gsum for the new Z (O(m d)); gsum excludes the current g here
        st["p"] = Bn @ gsum
        st["p"][-1] = 0

    hooks = {"z_plus": z_plus, "free": free, "fold": fold}
    for idx, val in xs:
        Zx = fd.Z[:, idx] @ val
        y = xbar[idx] @ val + st["beta"] @ Zx
        preds.append(y)
        ws.append(xbar + fd.Z.T @ st["beta"])
        g = (y - wstar[idx] @ val) * val
        lam = fd.absorb(idx, g, hooks)
        if fd.written is not None:  # a slot row written this step (z_k = g, was zero)
            st["p"][fd.written] = g @ gsum[idx]  # gsum before adding g: O(s)
        gsum[idx] += g
        st["p"] = st["p"] + fd.Z[:, idx] @ g  # p += Z_new g   O(ms)
        xbar[idx] -= eta * g / dlt
        sv = np.sqrt(lam)
        coef = np.where(lam > 0, sv / (dlt * (dlt + sv)) / np.where(lam > 0, lam, 1), 0)
        st["beta"] = eta * fd.F.T @ (coef * (fd.F @ st["p"]))
    perr = np.max(np.abs(st["p"] - fd.Z @ gsum)) / np.max(np.abs(fd.Z @ gsum))
    return np.array(preds), np.array(ws), fd, perr


# ---------------------------------------------------------------------------------- RP-SON
def rp_dense(xs, alpha, sig_eta, R):
    S, u = np.zeros((m, d)), np.zeros(d)
    preds, ws = [], []
    for t, (idx, val) in enumerate(xs):
        x = dense(idx, val)
        y = u @ x  # no projection here (C = inf)
        preds.append(y)
        ws.append(u.copy())
        g = (y - wstar @ x) * x
        S = S + np.outer(R[t], np.sqrt(sig_eta) * g)
        Hm = np.linalg.inv(alpha * np.eye(m) + S @ S.T)
        u = u - (g - S.T @ Hm @ S @ g) / alpha
    return np.array(preds), np.array(ws)


def rp_sparse(xs, alpha, sig_eta, R):
    S = np.zeros((m, d))
    Hm = np.eye(m) / alpha
    wbar, b = np.zeros(d), np.zeros(m)
    preds, ws = [], []
    for t, (idx, val) in enumerate(xs):
        y = wbar[idx] @ val + b @ (S[:, idx] @ val)
        preds.append(y)
        ws.append(wbar + S.T @ b)
        gv = (y - wstar[idx] @ val) * val
        ghv = np.sqrt(sig_eta) * gv
        r = R[t]
        # H^{-1} += q r^T + r q^T  (S_t ghat - |g|^2 r/2
        q = S[:, idx] @ ghv + 0.5 * (ghv @ ghv) * r
        #                                              with S_t = S_{t-1} + r ghat^T)
        for a_, c_ in ((q, r), (r, q)):  # two rank-one Sherman-Morrison updates, O(m^2)
            Ha = Hm @ a_
            Hc = Hm.T @ c_
            Hm = Hm - np.outer(Ha, Hc) / (1 + c_ @ Ha)
        wbar[idx] -= (r @ b) * ghv  # (S_t - S_{t-1})^T b
        S[:, idx] += np.outer(r, ghv)
        wbar[idx] -= gv / alpha
        b = b + Hm @ (S[:, idx] @ gv) / alpha
    return np.array(preds), np.array(ws)


if __name__ == "__main__":
    out = {}

    def perturbed(xs, k=7):  # the dense reference's own sensitivity: inputs * (1 + 1e-13 N(0,1))
        return [
            (i, v * (1 + 1e-13 * np.random.default_rng(k + j).normal(size=v.size)))
            for j, (i, v) in enumerate(xs)
        ]

    print(
        "columns: rel err preds, rel err weights, dense self-sensitivity (preds, weights), extras"
    )
    for seed in (1, 2, 3):
        xs = make_stream(seed)
        xp = perturbed(xs)
        V0 = np.linalg.qr(rng.normal(size=(d, m)))[0].T
        gam = np.array([1.0, 0.7, 0.9, 0.5])  # distinct diagonal Gamma_t: exercises A^{-1} = F^{-1}
        for C in (np.inf, 2.0):
            pd, wd = oja_dense(xs, ALPHA, C, 0.1, gam, V0)
            pp, wp = oja_dense(xp, ALPHA, C, 0.1, gam, V0)
            for dec in ("chol", "qr"):
                DECOMPOSE = dec
                for cmax in (1e3, 1e6):
                    COND_MAX = cmax
                    ps, wsp, orth, kerr, nre = oja_sparse(xs, ALPHA, C, 0.1, gam, V0)
                    out[f"oja[{dec},cond(F)<{cmax:.0e}] seed{seed} C={C}"] = (
                        rel(ps, pd),
                        rel(wsp, wd),
                        rel(pp, pd),
                        rel(wp, wd),
                        f"|FZ(FZ)^T-I|={orth:.1e} |K-ZZ^T|={kerr:.1e} remat={nre}",
                    )
        for rule in ("md", "da"):
            pd, wd = adafd_dense(xs, 0.01, 0.5, rule)
            pp, wp = adafd_dense(xp, 0.01, 0.5, rule)
            if rule == "md":
                ps, wsp, fd = adafd_sparse(xs, 0.01, 0.5, "md")
                extra = ""
            else:
                ps, wsp, fd, perr = adafd_sparse_da(xs, 0.01, 0.5)
                extra = f" |p - Z gsum|={perr:.1e}"
            out[f"adafd-{rule} seed{seed}"] = (
                rel(ps, pd),
                rel(wsp, wd),
                rel(pp, pd),
                rel(wp, wd),
                f"fast={fd.fast} fallback={fd.fallbacks} remat={fd.remat}" + extra,
            )
        R = np.random.default_rng(seed).normal(scale=1 / np.sqrt(m), size=(T, m))
        pd, wd = rp_dense(xs, ALPHA, 0.5, R)
        ps, wsp = rp_sparse(xs, ALPHA, 0.5, R)
        out[f"rp seed{seed}"] = (rel(ps, pd), rel(wsp, wd), float("nan"), float("nan"), "")
    for k, v in out.items():
        print(f"{k:42s}", " ".join(f"{x:.1e}" for x in v[:4]), v[4])
