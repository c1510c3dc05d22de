"""The built-in jobs, one module per subcommand (``jobs/<command>.py`` mirrors ``commands/<command>.py``):
:class:`ScoreJob`, :class:`DistancesJob`, :class:`ContactsJob`, :class:`RmsdJob` and
:class:`CoordinatesJob`."""

from .contacts import ContactsJob
from .distances import DistancesJob
from .rmsd import CoordinatesJob, RmsdJob
from .score import ScoreJob

__all__ = ["ContactsJob", "CoordinatesJob", "DistancesJob", "RmsdJob", "ScoreJob"]
