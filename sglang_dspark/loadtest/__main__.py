import sys

from sglang_dspark.loadtest.runner import main

sys.exit(main())
