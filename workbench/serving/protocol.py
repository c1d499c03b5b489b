"""What a client and the server agree on without importing each other: the served model's id and the
default address. :mod:`workbench.load.client` and :mod:`workbench.load.load` import these from
here, never from :mod:`workbench.serving.server`."""

SERVED_MODEL = "workbench-default"   # the ``model`` id the server reports (``/v1/models``) and clients send
DEFAULT_HOST = "127.0.0.1"           # the server binds loopback unless another host is named
DEFAULT_PORT = 8000
API_KEY_ENV = "WORKBENCH_API_KEY"    # the environment variable holding the server's API key
