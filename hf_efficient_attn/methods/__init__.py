"""Attention methods; importing this package registers every method."""

from . import softmax  # noqa: F401
from . import linformer  # noqa: F401
from . import performer  # noqa: F401
from . import yoso  # noqa: F401
from . import mra  # noqa: F401
from . import nystromformer, skyformer  # noqa: F401
from . import skeinformer, informer  # noqa: F401
