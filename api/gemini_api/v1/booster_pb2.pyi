from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers

DESCRIPTOR: _descriptor.FileDescriptor

class Theta(_message.Message):
    __slots__ = ("add_increase", "init_cwnd", "loss_threshold", "mult_decrease", "mult_increase", "rtt_threshold", "window_intervals")
    INIT_CWND_FIELD_NUMBER: _ClassVar[int]
    MULT_INCREASE_FIELD_NUMBER: _ClassVar[int]
    ADD_INCREASE_FIELD_NUMBER: _ClassVar[int]
    MULT_DECREASE_FIELD_NUMBER: _ClassVar[int]
    LOSS_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    RTT_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    WINDOW_INTERVALS_FIELD_NUMBER: _ClassVar[int]
    init_cwnd: int
    mult_increase: int
    add_increase: int
    mult_decrease: int
    loss_threshold: int
    rtt_threshold: int
    window_intervals: int
    def __init__(self, init_cwnd: int | None = ..., mult_increase: int | None = ..., add_increase: int | None = ..., mult_decrease: int | None = ..., loss_threshold: int | None = ..., rtt_threshold: int | None = ..., window_intervals: int | None = ...) -> None: ...

class Context(_message.Message):
    __slots__ = ("dst_isp", "dst_region", "hour", "src_isp", "src_region")
    SRC_REGION_FIELD_NUMBER: _ClassVar[int]
    SRC_ISP_FIELD_NUMBER: _ClassVar[int]
    DST_REGION_FIELD_NUMBER: _ClassVar[int]
    DST_ISP_FIELD_NUMBER: _ClassVar[int]
    HOUR_FIELD_NUMBER: _ClassVar[int]
    src_region: str
    src_isp: str
    dst_region: str
    dst_isp: str
    hour: int
    def __init__(self, src_region: str | None = ..., src_isp: str | None = ..., dst_region: str | None = ..., dst_isp: str | None = ..., hour: int | None = ...) -> None: ...

class QuantileSketch(_message.Message):
    __slots__ = ("counts", "offset", "relative_accuracy", "zero_count")
    RELATIVE_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    ZERO_COUNT_FIELD_NUMBER: _ClassVar[int]
    relative_accuracy: float
    offset: int
    counts: _containers.RepeatedScalarFieldContainer[float]
    zero_count: float
    def __init__(self, relative_accuracy: float | None = ..., offset: int | None = ..., counts: _Iterable[float] | None = ..., zero_count: float | None = ...) -> None: ...

class Aggregate(_message.Message):
    __slots__ = ("context", "flow_count", "queue_delay_ms_sq_sum", "queue_delay_ms_sum", "size_bucket_counts", "slow_flow_count", "theta", "theta_version", "throughput_mbps_sq_sum", "throughput_mbps_sum", "throughput_queue_delay_sum", "throughput_sketch")
    THETA_FIELD_NUMBER: _ClassVar[int]
    THETA_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    FLOW_COUNT_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_MBPS_SUM_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_MBPS_SQ_SUM_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DELAY_MS_SUM_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DELAY_MS_SQ_SUM_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_QUEUE_DELAY_SUM_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_SKETCH_FIELD_NUMBER: _ClassVar[int]
    SLOW_FLOW_COUNT_FIELD_NUMBER: _ClassVar[int]
    SIZE_BUCKET_COUNTS_FIELD_NUMBER: _ClassVar[int]
    theta: Theta
    theta_version: int
    context: Context
    flow_count: int
    throughput_mbps_sum: float
    throughput_mbps_sq_sum: float
    queue_delay_ms_sum: float
    queue_delay_ms_sq_sum: float
    throughput_queue_delay_sum: float
    throughput_sketch: QuantileSketch
    slow_flow_count: int
    size_bucket_counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, theta: Theta | _Mapping | None = ..., theta_version: int | None = ..., context: Context | _Mapping | None = ..., flow_count: int | None = ..., throughput_mbps_sum: float | None = ..., throughput_mbps_sq_sum: float | None = ..., queue_delay_ms_sum: float | None = ..., queue_delay_ms_sq_sum: float | None = ..., throughput_queue_delay_sum: float | None = ..., throughput_sketch: QuantileSketch | _Mapping | None = ..., slow_flow_count: int | None = ..., size_bucket_counts: _Iterable[int] | None = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("aggregates", "host_id", "interval_end_unix_ms", "interval_start_unix_ms", "policy", "report_id")
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_START_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_END_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    AGGREGATES_FIELD_NUMBER: _ClassVar[int]
    report_id: str
    host_id: str
    policy: str
    interval_start_unix_ms: int
    interval_end_unix_ms: int
    aggregates: _containers.RepeatedCompositeFieldContainer[Aggregate]
    def __init__(self, report_id: str | None = ..., host_id: str | None = ..., policy: str | None = ..., interval_start_unix_ms: int | None = ..., interval_end_unix_ms: int | None = ..., aggregates: _Iterable[Aggregate | _Mapping] | None = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("aggregates_stored", "duplicate")
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    AGGREGATES_STORED_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    aggregates_stored: int
    def __init__(self, duplicate: bool | None = ..., aggregates_stored: int | None = ...) -> None: ...

class GetParametersRequest(_message.Message):
    __slots__ = ("contexts", "host_id", "policy")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CONTEXTS_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    policy: str
    contexts: _containers.RepeatedCompositeFieldContainer[Context]
    def __init__(self, host_id: str | None = ..., policy: str | None = ..., contexts: _Iterable[Context | _Mapping] | None = ...) -> None: ...

class ContextParameters(_message.Message):
    __slots__ = ("context", "exploratory", "plan_version", "predicted_utility", "theta")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    THETA_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPLORATORY_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_UTILITY_FIELD_NUMBER: _ClassVar[int]
    context: Context
    theta: Theta
    plan_version: int
    exploratory: bool
    predicted_utility: float
    def __init__(self, context: Context | _Mapping | None = ..., theta: Theta | _Mapping | None = ..., plan_version: int | None = ..., exploratory: bool | None = ..., predicted_utility: float | None = ...) -> None: ...

class GetParametersResponse(_message.Message):
    __slots__ = ("default_theta", "parameters", "refresh_after_seconds", "target_cc")
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_THETA_FIELD_NUMBER: _ClassVar[int]
    TARGET_CC_FIELD_NUMBER: _ClassVar[int]
    REFRESH_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    parameters: _containers.RepeatedCompositeFieldContainer[ContextParameters]
    default_theta: Theta
    target_cc: str
    refresh_after_seconds: int
    def __init__(self, parameters: _Iterable[ContextParameters | _Mapping] | None = ..., default_theta: Theta | _Mapping | None = ..., target_cc: str | None = ..., refresh_after_seconds: int | None = ...) -> None: ...
