"""Stand-ins, written by us, for the test helpers the SDKs' own tests import but PyPI lacks.

Microsoft's tests import ``devtools_testutils`` (from the azure-sdk-tools
repository, not on PyPI), their own ``servicebus_preparer`` (which creates
Azure resources through Azure Resource Manager) and
``azure.mgmt.servicebus.models``. The fidelity runner puts one-line shims
with those import names on the test run's ``sys.path``; each shim re-exports
a module of this package:

* :mod:`.devtools` - ``devtools_testutils``: test base classes, no-op
  recording sanitizers, ``get_credential`` (the test server's shared access
  key), and the pytest plugin that starts the test server;
* :mod:`.servicebus_resources` - ``servicebus_preparer``: the resource
  decorators, which name entities of the test server instead of creating
  Azure resources;
* :mod:`.mgmt_models` - ``azure.mgmt.servicebus.models``: ``AccessRights``.

Only the names the tests import are here, and they adapt resources and
credentials only: no test's assertion passes through them.
"""
