"""The request classifier at inference time: load the shipped artifact, score a request in numpy.

The artifact is a plain `.npz` of arrays (loaded with `allow_pickle=False`) plus a JSON metadata
blob stored as a uint8 array: no pickled objects, no network, no retraining.

Scoring is a linear model over `classifier.features` (standardised dense statistics plus two
Naive Bayes n-gram scores, see `classifier.train`): logits relative to `chat` (softmax is
shift-invariant, so two columns carry the whole multinomial model), divided by a fitted
temperature. The Naive Bayes n-gram table's two columns are stored side by side as one complex64 array so
a single `take` + `sum` scores all buckets of a request at once.

`classify` runs the fast path: `features.scan` gives the dense vector in `features.FAST_ORDER` and the
bucket ids; at load time the standardisation, the clip bounds, the NB weights and the temperature are
folded into one (2, N_DENSE) matrix, two biases and clip bounds on the raw features; the NB table
stays complex64 (1 MB, cache-friendly) and its mean is mapped to logits by four floats, so scoring
is clip + one small matmul + one gather-and-sum. It gives the
same probabilities as the reference formulation (`logits` / `probabilities` on `Features`) up to float
rounding (tested to 1e-12).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from classifier import features as F

try:  # the clip ufunc itself, without np.clip's Python-level dispatch
    from numpy._core.umath import clip as _clip
except ImportError:  # pragma: no cover - other numpy layouts
    _clip = np.clip
_add_reduce = np.add.reduce
_C128 = np.dtype(np.complex128)

LABELS: tuple[str, str, str] = ("chat", "code", "math")
ARTIFACT_NAME = "classifier.npz"
ARRAY_NAMES = ("w_dense", "w_nb", "nb", "bias", "mu", "sd", "temperature")
DENSE_CLIP = 6.0
_LOG3 = math.log(3.0)
_UNIFORM = {label: 1.0 / 3.0 for label in LABELS}


class Prediction(NamedTuple):
    """`label, probabilities, uncertainty = classify(messages)`.

    `uncertainty` is the normalised entropy of the probabilities: 0 = certain, 1 = uniform.
    """

    label: str
    probabilities: dict[str, float]
    uncertainty: float

    @property
    def p_code_math(self) -> float:
        """Binary view: probability that the request is code or math (not chat)."""
        return self.probabilities["code"] + self.probabilities["math"]

    @property
    def binary_label(self) -> str:
        """Binary view: `chat` or `code_math`."""
        return "code_math" if self.p_code_math > 0.5 else "chat"


@dataclass(frozen=True)
class ArtifactInfo:
    version: str
    data_hash: str
    feature_version: int
    trained_at: str
    metrics: dict[str, Any]


def default_artifact_path() -> Path:
    return Path(str(resources.files("classifier").joinpath("artifacts", ARTIFACT_NAME)))


def normalised_entropy(probs: np.ndarray) -> float:
    p = probs[probs > 0.0]
    return float(min(1.0, max(0.0, -(p * np.log(p)).sum() / _LOG3)))


def junk_weight(junk: float) -> float:
    """How much of a prediction to replace by the uniform distribution, given the junk share."""
    return min(1.0, max(0.0, (junk - 0.1) / 0.3))


class Classifier:
    """A loaded classifier. Immutable after construction; safe to share between threads."""

    def __init__(
        self,
        *,
        w_dense: np.ndarray,
        w_nb: np.ndarray,
        nb: np.ndarray,
        bias: np.ndarray,
        mu: np.ndarray,
        sd: np.ndarray,
        temperature: float,
        info: ArtifactInfo,
        config: dict[str, Any],
    ) -> None:
        if w_dense.shape != (2, F.N_DENSE):
            raise ValueError(f"dense weights have shape {w_dense.shape}, expected (2, {F.N_DENSE})")
        if nb.shape != (F.N_BUCKETS, 2) or w_nb.shape != (2, 2):
            raise ValueError(
                f"NB table {nb.shape} / weights {w_nb.shape}, expected ({F.N_BUCKETS}, 2) / (2, 2)"
            )
        self._w_dense = np.ascontiguousarray(w_dense, dtype=np.float64)
        self._w_nb = np.asarray(w_nb, dtype=np.float64)
        self.nb_table = np.ascontiguousarray(nb, dtype=np.float32)
        self._nb = self.nb_table.view(np.complex64).ravel()  # code + 1j * math, per bucket (8 bytes)
        self._bias = np.asarray(bias, dtype=np.float64)
        self._mu = np.asarray(mu, dtype=np.float64)
        sd = np.asarray(sd, dtype=np.float64)
        self._inv_sd = 1.0 / sd
        self._inv_t = 1.0 / float(temperature)
        self.info = info
        self.config = config
        # Fast path (`classify`): the dense vector arrives in F.FAST_ORDER. Clipping z = (x - mu) / sd
        # to [-c, c] is clipping x to [mu - c sd, mu + c sd]; the standardisation folds into the weights,
        # w . z = (w / sd) . x - (w / sd) . mu, and so does the temperature (everything is linear in it).
        order = F.FAST_ORDER
        inv_t = self._inv_t
        w_fast = self._w_dense[:, order] / sd[order]
        self._fast_w = np.ascontiguousarray(w_fast * inv_t)
        self._fast_lo = self._mu[order] - DENSE_CLIP * sd[order]
        self._fast_hi = self._mu[order] + DENSE_CLIP * sd[order]
        b = (self._bias - w_fast @ self._mu[order]) * inv_t
        self._fast_b = (float(b[0]), float(b[1]))
        # the NB scores (code + 1j * math, the mean over the buckets of the complex64 table: 1 MB, half
        # of a complex128 table of per-bucket logits, which matters for cache misses under load) -> logits / T
        w_nb = self._w_nb * inv_t
        self._fast_nb_w = (float(w_nb[0, 0]), float(w_nb[0, 1]), float(w_nb[1, 0]), float(w_nb[1, 1]))

    # -- construction --------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path | None = None) -> Classifier:
        """Load an artifact (default: the one shipped in the package)."""
        path = Path(path) if path is not None else default_artifact_path()
        if not path.is_file():
            raise FileNotFoundError(
                f"classifier artifact not found: {path} (run `specroute classifier train`)"
            )
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta_json"]).decode("utf-8"))
            arrays = {name: z[name] for name in ARRAY_NAMES}
        config = meta.get("features", {})
        expected = feature_config()
        if config != expected:
            raise ValueError(f"artifact {path} was built for features {config}, this code has {expected}")
        info = ArtifactInfo(
            version=str(meta.get("version", "")),
            data_hash=str(meta.get("data_hash", "")),
            feature_version=int(config.get("feature_version", -1)),
            trained_at=str(meta.get("trained_at", "")),
            metrics=dict(meta.get("metrics", {})),
        )
        temperature = float(arrays.pop("temperature"))
        return cls(**arrays, temperature=temperature, info=info, config=config)

    # -- scoring ----------------------------------------------------------------------------

    def _relative_logits(self, feats: F.Features) -> tuple[float, float]:
        """Uncalibrated logits of code and math relative to chat (chat's logit is 0)."""
        z = (feats.dense - self._mu) * self._inv_sd
        np.clip(z, -DENSE_CLIP, DENSE_CLIP, out=z)
        out = self._w_dense @ z + self._bias
        code, math_ = float(out[0]), float(out[1])
        n = feats.buckets.size
        if n:
            s = complex(self._nb.take(feats.buckets).sum(dtype=np.complex128)) / n
            code += self._w_nb[0, 0] * s.real + self._w_nb[0, 1] * s.imag
            math_ += self._w_nb[1, 0] * s.real + self._w_nb[1, 1] * s.imag
        return code, math_

    def logits(self, feats: F.Features) -> np.ndarray:
        """Uncalibrated logits (chat, code, math) relative to chat (chat's is 0)."""
        code, math_ = self._relative_logits(feats)
        return np.array([0.0, code, math_])

    def probabilities(self, feats: F.Features) -> np.ndarray:
        return np.array(self._probs(feats))

    def _probs(self, feats: F.Features) -> tuple[float, float, float]:
        # three classes: plain floats are cheaper than numpy here
        code, math_ = self._relative_logits(feats)
        z1, z2 = code * self._inv_t, math_ * self._inv_t
        m = max(0.0, z1, z2)
        e0, e1, e2 = math.exp(-m), math.exp(z1 - m), math.exp(z2 - m)
        total = e0 + e1 + e2
        return e0 / total, e1 / total, e2 / total

    def classify(self, messages: Any) -> Prediction:
        """Classify a request: a list of `{"role", "content"}` messages, or a plain prompt string.

        Never raises on bad content: empty or whitespace-only input and input without any letters
        or digits get the uniform distribution (uncertainty 1); binary garbage is pulled towards it.
        """
        sample, full_len = F.request_text(messages)
        return self.classify_sample(sample, full_len)

    def classify_sample(self, sample: str, full_len: int) -> Prediction:
        """`classify` of an already extracted sample (see `features.request_text`)."""
        scanned = F.scan(sample, full_len)
        if scanned is None or not scanned[3]:
            return Prediction(LABELS[0], dict(_UNIFORM), 1.0)
        dense, buckets, junk, _ = scanned
        _clip(dense, self._fast_lo, self._fast_hi, dense)
        z1, z2 = self._fast_w.dot(dense).tolist()  # (`dot`, positional arguments: cheaper calls than `@`)
        s = complex(_add_reduce(self._nb.take(buckets), 0, _C128)) / buckets.size
        sr, si = s.real, s.imag
        w00, w01, w10, w11 = self._fast_nb_w
        b_code, b_math = self._fast_b
        z1 += b_code + (w00 * sr + w01 * si)
        z2 += b_math + (w10 * sr + w11 * si)
        m = max(0.0, z1, z2)
        e0, e1, e2 = math.exp(-m), math.exp(z1 - m), math.exp(z2 - m)
        total = e0 + e1 + e2
        p0, p1, p2 = e0 / total, e1 / total, e2 / total
        w = junk_weight(junk)
        if w > 0.0:
            p0, p1, p2 = ((1.0 - w) * p + w / 3.0 for p in (p0, p1, p2))
        if not math.isfinite(p0 + p1 + p2):  # defensive: never hand the gateway NaNs
            return Prediction(LABELS[0], dict(_UNIFORM), 1.0)
        i = 0 if p0 >= p1 and p0 >= p2 else (1 if p1 >= p2 else 2)
        h = 0.0
        for p in (p0, p1, p2):
            if p > 0.0:
                h -= p * math.log(p)
        h /= _LOG3
        return Prediction(LABELS[i], {"chat": p0, "code": p1, "math": p2}, min(1.0, max(0.0, h)))


def feature_config() -> dict[str, Any]:
    """The feature settings an artifact must have been trained with."""
    return {
        "feature_version": F.FEATURE_VERSION,
        "head_chars": F.HEAD_CHARS,
        "tail_chars": F.TAIL_CHARS,
        "user_turns": F.USER_TURNS,
        "hash_bits": F.HASH_BITS,
        "ngram_orders": list(F.NGRAM_ORDERS),
        "n_dense": F.N_DENSE,
        "dense_names": list(F.DENSE_NAMES),
    }


@functools.lru_cache(maxsize=1)
def default_classifier() -> Classifier:
    """The shipped classifier, loaded once per process."""
    return Classifier.load()


def classify(messages: Any) -> Prediction:
    """`(label, probabilities, uncertainty)` of a request, with the shipped classifier."""
    return default_classifier().classify(messages)
