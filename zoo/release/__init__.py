"""Floor 4: what publishes a trained model: exports (release folders from checkpoints, ONNX), the Hub upload,
timm's registry, `zoo check` against the cards' targets, and the report page. Loading a release (local or
from the Hub) is the models floor's (zoo/models/pretrained.py), as in timm, so that training can start
from one."""
