#!/bin/bash
printf '#!/bin/sh\necho ok\n' > run.sh
chmod +x run.sh
