"""plnexp's version (pyproject's ``version``), where every layer can read it without importing the
package's top (``plnexp.__version__`` is this), which reaches the store."""

VERSION = "0.1.0"
