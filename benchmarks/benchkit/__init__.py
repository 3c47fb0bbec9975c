"""The pieces every benchmark under benchmarks/ shares: see benchmarks/README.md."""

from .client import (
    SMALL_PAYLOAD,
    SseScanner,
    SyncHttp,
    messages_request,
    open_tunnel,
    post,
    push_bytes,
    stream_once,
    stream_payload,
)
from .core import (
    HERE,
    LOOPBACK,
    MB,
    RESULTS,
    ROOT,
    SINK_HOST,
    BenchError,
    Child,
    Children,
    Deadline,
    Entry,
    claude_bottle_argv,
    command_line,
    fmt,
    free_port,
    kb_to_mb,
    log,
    machine_info,
    make_token,
    percentile,
    print_verdicts,
    proc_cpu_s,
    proc_status_kb,
    ratio,
    rounded,
    tool_version,
    tree_cpu,
    tree_kb,
    wait_port,
)
from .results import details_block, machine_line, results_table, status_lines, target_lines, write_results

__all__ = [
    "HERE", "LOOPBACK", "MB", "RESULTS", "ROOT", "SINK_HOST", "SMALL_PAYLOAD", "BenchError", "Child", "Children",
    "Deadline", "Entry", "SseScanner", "SyncHttp", "claude_bottle_argv", "command_line", "details_block", "fmt",
    "free_port", "kb_to_mb", "log", "machine_info", "machine_line", "make_token", "messages_request", "open_tunnel",
    "percentile", "post", "print_verdicts", "proc_cpu_s", "proc_status_kb", "push_bytes", "ratio", "results_table",
    "rounded", "status_lines", "stream_once", "stream_payload", "target_lines", "tool_version", "tree_cpu",
    "tree_kb", "wait_port", "write_results",
]
