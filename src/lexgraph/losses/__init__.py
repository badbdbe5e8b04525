"""Training losses, one per module named after its class (see DEVELOPERS.md)."""

from lexgraph.losses.DistillationLoss import DistillationLoss  # noqa: F401
from lexgraph.losses.InfoNCELoss import InfoNCELoss  # noqa: F401
from lexgraph.losses.QabisarLoss import QabisarLoss  # noqa: F401
