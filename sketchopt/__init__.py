"""sketchopt: full-matrix adaptive online learning at the cost of a diagonal method.

Ada-FD (AdaGrad whose full-matrix proximal term is kept as a frequent-directions sketch), robust
frequent directions, the sketched online Newton family, the AdaGrad baselines and the classic sparse
online learners, all as pure-functional Optax gradient transformations.
"""

from sketchopt import metrics as metrics
from sketchopt import regularizers as regularizers
from sketchopt import sharding as sharding
from sketchopt import sketches as sketches
from sketchopt.baselines import *  # noqa: F403
from sketchopt.son import *  # noqa: F403
from sketchopt.transforms import *  # noqa: F403

__version__ = "0.2.0"
