"""Request classifier: chat / code / math with calibrated uncertainty, in microseconds.

    from classifier import classify
    label, probabilities, uncertainty = classify([{"role": "user", "content": "def f(x): ..."}])

`classify` uses the artifact shipped in `classifier/artifacts/` (loaded once per process);
`Classifier.load(path)` gives an explicit object for callers that manage their own.
"""

from classifier.model import Classifier, Prediction, classify, default_classifier

__all__ = ["Classifier", "Prediction", "classify", "default_classifier"]
