"""``python -m siftmq.frontend``: one front-end process, started by the broker's core."""

import sys

from siftmq.frontend.edge import main

sys.exit(main())
