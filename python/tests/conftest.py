import os
import sys

# Tests run against the package in this source tree unless GRADOPS_TEST_INSTALLED=1 asks for the
# installed one (scripts/test_python.sh checks both ways).
if os.environ.get("GRADOPS_TEST_INSTALLED") != "1":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
