"""The names of the kernel signals that are read by name outside the family that
measures them (the window, attribution's causes, the daemon's status): one place, so
that a rename is one edit and a misspelling an ImportError, not a cause that silently
reads nothing. Each family declares its signals with these names (its metric and
meaning beside them, collectors/kernel/families/); a signal only its own family and
the exporter read keeps its name there."""

# http family: one exchange on a watched server's socket.
HTTP_REQUEST = "http_request"        # request read to response written
HTTP_FIRST_BYTE = "http_first_byte"  # request to the response's first byte (TTFT when it streams)
HTTP_WRITE_GAP = "http_write_gap"    # between the writes of one response (the inter-token gap)
HTTP_STATUS = "http_status"          # responses by status class ("5xx", ...)
HTTP_REFUSED = "http_refused"        # 429 and 503 answers, timed apart
HTTP_ARRIVED = "http_arrived"        # requests read as they came, answered or not yet
# redis family: one command on a watched Redis server's socket.
REDIS_COMMAND = "redis_command"      # command read to its reply written, by command class
REDIS_ERRORS = "redis_errors"        # error replies
REDIS_ARRIVED = "redis_arrived"      # commands read as they came, answered or not yet
REDIS_BLOCKING = "blocking"          # the command class whose time is someone else's (BLPOP)
# runqueue, offcpu: the CPU and blocking syscalls.
RUNQUEUE_WAIT = "runqueue_wait"
OFFCPU = "offcpu"                    # labelled by syscall class
# tcp: per peer.
TCP_RTT = "tcp_rtt"
TCP_CONNECT = "tcp_connect"
TCP_RETRANSMITS = "tcp_retransmits"
TCP_PREFIX = "tcp_"                  # any tcp family signal: the family runs for the service
# tls
TLS_HANDSHAKE = "tls_handshake"
TLS_PREFIX = "tls_"
