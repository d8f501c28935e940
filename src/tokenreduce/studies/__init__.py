"""The registered studies, one module each, named as registered (and as their results folder,
results/<name>/<bed>/): one per paper (``eet``, ``imagepiece``, ``cropr`` and ``cropr_seg``, ``bspf``,
``pitome``, ``diffrate``, ``saint``), the baselines' benchmark (``baselines``), and the project's own records
(``reference``, ``platform``, ``deit_bench``, ``backends``). Importing this package registers them."""

from . import (  # noqa: F401
    backends,
    baselines,
    bspf,
    cropr,
    cropr_seg,
    deit_bench,
    diffrate,
    eet,
    imagepiece,
    pitome,
    platform,
    reference,
    saint,
)
