"""The plug-ins rule files may name beyond their kinds, as the loader is given them.

``rules/`` validates rule files but may not import ``connectors/`` (``rules/plugins.py`` says
why the registries are passed in rather than imported). This is the one place that gathers
them; every command and the worker hand ``PLUGINS`` to the loader and the JSON Schema.
"""

from __future__ import annotations

from costline.connectors.checkpoints import CHECKPOINT_CONNECTORS
from costline.connectors.enforce import ENFORCERS
from costline.connectors.notify import NOTIFIERS
from costline.connectors.reclaim import RECLAIMERS
from costline.rules.plugins import Plugins

PLUGINS = Plugins(reclaimers=RECLAIMERS, enforcers=ENFORCERS, notifiers=NOTIFIERS,
                  checkpoint_connectors=CHECKPOINT_CONNECTORS)
