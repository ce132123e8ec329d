"""The request classifier at inference time: load the shipped artifact, score a request in numpy.

The artifact is a plain `.npz` of arrays (loaded with `allow_pickle=False`) plus a JSON metadata
blob stored as a uint8 array: no pickled objects, no network, no retraining.

Scoring is a linear model over `classifier.features` (standardised dense statistics plus two
Naive Bayes n-gram scores, see `classifier.train`): logits relative to `chat` (softmax is
shift-invariant, so two columns carry the whole multinomial model), divided by a fitted
temperature. The Naive Bayes n-gram table's two columns are stored side by side as one complex128 array so
a single `take` + `sum` scores all buckets of a request at once.
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
            raise ValueError(f"NB table {nb.shape} / weights {w_nb.shape}, expected ({F.N_BUCKETS}, 2) / (2, 2)")
        self._w_dense = np.ascontiguousarray(w_dense, dtype=np.float64)
        self._w_nb = np.asarray(w_nb, dtype=np.float64)
        self.nb_table = np.ascontiguousarray(nb, dtype=np.float64)
        self._nb = self.nb_table.view(np.complex128).ravel()  # code + 1j * math, per bucket
        self._bias = np.asarray(bias, dtype=np.float64)
        self._mu = np.asarray(mu, dtype=np.float64)
        self._inv_sd = 1.0 / np.asarray(sd, dtype=np.float64)
        self._inv_t = 1.0 / float(temperature)
        self.info = info
        self.config = config

    # -- construction --------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path | None = None) -> Classifier:
        """Load an artifact (default: the one shipped in the package)."""
        path = Path(path) if path is not None else default_artifact_path()
        if not path.is_file():
            raise FileNotFoundError(f"classifier artifact not found: {path} (run `specroute classifier train`)")
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
        return cls(
            w_dense=arrays["w_dense"],
            w_nb=arrays["w_nb"],
            nb=arrays["nb"],
            bias=arrays["bias"],
            mu=arrays["mu"],
            sd=arrays["sd"],
            temperature=float(arrays["temperature"]),
            info=info,
            config=config,
        )

    # -- scoring ----------------------------------------------------------------------------

    def logits(self, feats: F.Features) -> np.ndarray:
        """Uncalibrated logits (chat, code, math) relative to chat (chat's is 0)."""
        z = (feats.dense - self._mu) * self._inv_sd
        np.clip(z, -DENSE_CLIP, DENSE_CLIP, out=z)
        out = self._w_dense @ z + self._bias
        n = feats.buckets.size
        if n:
            s = self._nb.take(feats.buckets).sum() / n
            out += self._w_nb[:, 0] * s.real + self._w_nb[:, 1] * s.imag
        return np.array([0.0, out[0], out[1]])

    def probabilities(self, feats: F.Features) -> np.ndarray:
        z = self.logits(feats) * self._inv_t
        z -= z.max()
        e = np.exp(z)
        return e / e.sum()

    def classify(self, messages: Any) -> Prediction:
        """Classify a request: a list of `{"role", "content"}` messages, or a plain prompt string.

        Never raises on bad content: empty or whitespace-only input and input without any letters
        or digits get the uniform distribution (uncertainty 1); binary garbage is pulled towards it.
        """
        sample, full_len = F.request_text(messages)
        return self.classify_sample(sample, full_len)

    def classify_sample(self, sample: str, full_len: int) -> Prediction:
        feats = F.extract(sample, full_len)
        if feats.buckets.size == 0 or not _has_alnum(sample):
            return Prediction(LABELS[0], dict(_UNIFORM), 1.0)
        p = self.probabilities(feats)
        w = junk_weight(feats.junk)
        if w > 0.0:
            p = (1.0 - w) * p + w / 3.0
        if not np.all(np.isfinite(p)):  # defensive: never hand the gateway NaNs
            return Prediction(LABELS[0], dict(_UNIFORM), 1.0)
        i = int(np.argmax(p))
        return Prediction(
            LABELS[i],
            {"chat": float(p[0]), "code": float(p[1]), "math": float(p[2])},
            normalised_entropy(p),
        )


def _has_alnum(sample: str) -> bool:
    """Whether the sample has any letter or digit (ASCII checked in C; others on a bounded prefix)."""
    raw = sample.encode("utf-8", errors="surrogatepass")
    if len(raw.translate(None, _ALNUM_BYTES)) < len(raw):
        return True
    return not sample.isascii() and any(ch.isalnum() for ch in sample[:4096])


_ALNUM_BYTES = bytes(range(48, 58)) + bytes(range(65, 91)) + bytes(range(97, 123))


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
