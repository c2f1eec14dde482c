"""The etcd meta layer: a library, so it is silent until the application turns its logs on.

``logger.enable("meta")`` does (``querycoord.logs.setup_logging`` calls it):
a program that imports ``meta`` keeps control of what reaches its log.
"""

from loguru import logger

logger.disable("meta")
