#!/bin/bash
printf '#!/bin/sh\necho done\n' > run.sh
chmod +x run.sh
