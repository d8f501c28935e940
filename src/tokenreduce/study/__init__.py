"""The study engine: a study declared as data (study/declare.py), planned and run into one record per run
(study/runner.py), read back and checked (study/records.py), judged (study/stats.py, study/tables.py) and
written as a page (study/page.py). The declarations it runs live under ``tokenreduce.studies``, one module
per paper; the probes they call under ``tokenreduce.probes``."""

from .declare import Arm, Axis, Bed, Col, Expect, Probe, Study, Timing, get_study, list_studies, reading, register_study
from .testbed import Testbed

__all__ = ["Arm", "Axis", "Bed", "Col", "Expect", "Probe", "Study", "Testbed", "Timing", "get_study", "list_studies",
           "reading", "register_study"]
