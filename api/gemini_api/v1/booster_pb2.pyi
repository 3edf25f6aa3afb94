from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Theta(_message.Message):
    __slots__ = ("init_cwnd", "mult_increase", "add_increase", "mult_decrease", "loss_threshold", "rtt_threshold", "window_intervals")
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
    def __init__(self, init_cwnd: _Optional[int] = ..., mult_increase: _Optional[int] = ..., add_increase: _Optional[int] = ..., mult_decrease: _Optional[int] = ..., loss_threshold: _Optional[int] = ..., rtt_threshold: _Optional[int] = ..., window_intervals: _Optional[int] = ...) -> None: ...

class Context(_message.Message):
    __slots__ = ("src_region", "src_isp", "dst_region", "dst_isp", "hour")
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
    def __init__(self, src_region: _Optional[str] = ..., src_isp: _Optional[str] = ..., dst_region: _Optional[str] = ..., dst_isp: _Optional[str] = ..., hour: _Optional[int] = ...) -> None: ...

class QuantileSketch(_message.Message):
    __slots__ = ("relative_accuracy", "offset", "counts", "zero_count", "key_stride", "first_bin", "bin_bitmap", "bin_counts")
    RELATIVE_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    ZERO_COUNT_FIELD_NUMBER: _ClassVar[int]
    KEY_STRIDE_FIELD_NUMBER: _ClassVar[int]
    FIRST_BIN_FIELD_NUMBER: _ClassVar[int]
    BIN_BITMAP_FIELD_NUMBER: _ClassVar[int]
    BIN_COUNTS_FIELD_NUMBER: _ClassVar[int]
    relative_accuracy: float
    offset: int
    counts: _containers.RepeatedScalarFieldContainer[float]
    zero_count: float
    key_stride: int
    first_bin: int
    bin_bitmap: bytes
    bin_counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, relative_accuracy: _Optional[float] = ..., offset: _Optional[int] = ..., counts: _Optional[_Iterable[float]] = ..., zero_count: _Optional[float] = ..., key_stride: _Optional[int] = ..., first_bin: _Optional[int] = ..., bin_bitmap: _Optional[bytes] = ..., bin_counts: _Optional[_Iterable[int]] = ...) -> None: ...

class Aggregate(_message.Message):
    __slots__ = ("theta", "theta_version", "context", "flow_count", "throughput_mbps_sum", "throughput_mbps_sq_sum", "queue_delay_ms_sum", "queue_delay_ms_sq_sum", "throughput_queue_delay_sum", "throughput_sketch", "slow_flow_count", "size_bucket_counts", "cc", "datapath_theta", "queue_delay_sketch", "completion")
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
    CC_FIELD_NUMBER: _ClassVar[int]
    DATAPATH_THETA_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DELAY_SKETCH_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
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
    cc: str
    datapath_theta: DatapathTheta
    queue_delay_sketch: QuantileSketch
    completion: CompletionSums
    def __init__(self, theta: _Optional[_Union[Theta, _Mapping]] = ..., theta_version: _Optional[int] = ..., context: _Optional[_Union[Context, _Mapping]] = ..., flow_count: _Optional[int] = ..., throughput_mbps_sum: _Optional[float] = ..., throughput_mbps_sq_sum: _Optional[float] = ..., queue_delay_ms_sum: _Optional[float] = ..., queue_delay_ms_sq_sum: _Optional[float] = ..., throughput_queue_delay_sum: _Optional[float] = ..., throughput_sketch: _Optional[_Union[QuantileSketch, _Mapping]] = ..., slow_flow_count: _Optional[int] = ..., size_bucket_counts: _Optional[_Iterable[int]] = ..., cc: _Optional[str] = ..., datapath_theta: _Optional[_Union[DatapathTheta, _Mapping]] = ..., queue_delay_sketch: _Optional[_Union[QuantileSketch, _Mapping]] = ..., completion: _Optional[_Union[CompletionSums, _Mapping]] = ...) -> None: ...

class CompletionSums(_message.Message):
    __slots__ = ("flow_count", "bytes_sum", "duration_us_sum", "mbit_sq_sum", "seconds_sq_sum", "mbit_seconds_sum")
    FLOW_COUNT_FIELD_NUMBER: _ClassVar[int]
    BYTES_SUM_FIELD_NUMBER: _ClassVar[int]
    DURATION_US_SUM_FIELD_NUMBER: _ClassVar[int]
    MBIT_SQ_SUM_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SQ_SUM_FIELD_NUMBER: _ClassVar[int]
    MBIT_SECONDS_SUM_FIELD_NUMBER: _ClassVar[int]
    flow_count: int
    bytes_sum: int
    duration_us_sum: int
    mbit_sq_sum: float
    seconds_sq_sum: float
    mbit_seconds_sum: float
    def __init__(self, flow_count: _Optional[int] = ..., bytes_sum: _Optional[int] = ..., duration_us_sum: _Optional[int] = ..., mbit_sq_sum: _Optional[float] = ..., seconds_sq_sum: _Optional[float] = ..., mbit_seconds_sum: _Optional[float] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("report_id", "host_id", "policy", "interval_start_unix_ms", "interval_end_unix_ms", "aggregates")
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
    def __init__(self, report_id: _Optional[str] = ..., host_id: _Optional[str] = ..., policy: _Optional[str] = ..., interval_start_unix_ms: _Optional[int] = ..., interval_end_unix_ms: _Optional[int] = ..., aggregates: _Optional[_Iterable[_Union[Aggregate, _Mapping]]] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("duplicate", "aggregates_stored")
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    AGGREGATES_STORED_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    aggregates_stored: int
    def __init__(self, duplicate: _Optional[bool] = ..., aggregates_stored: _Optional[int] = ...) -> None: ...

class GetParametersRequest(_message.Message):
    __slots__ = ("host_id", "policy", "contexts")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CONTEXTS_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    policy: str
    contexts: _containers.RepeatedCompositeFieldContainer[Context]
    def __init__(self, host_id: _Optional[str] = ..., policy: _Optional[str] = ..., contexts: _Optional[_Iterable[_Union[Context, _Mapping]]] = ...) -> None: ...

class ContextParameters(_message.Message):
    __slots__ = ("context", "theta", "plan_version", "exploratory", "predicted_utility", "datapath_theta")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    THETA_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPLORATORY_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_UTILITY_FIELD_NUMBER: _ClassVar[int]
    DATAPATH_THETA_FIELD_NUMBER: _ClassVar[int]
    context: Context
    theta: Theta
    plan_version: int
    exploratory: bool
    predicted_utility: float
    datapath_theta: DatapathTheta
    def __init__(self, context: _Optional[_Union[Context, _Mapping]] = ..., theta: _Optional[_Union[Theta, _Mapping]] = ..., plan_version: _Optional[int] = ..., exploratory: _Optional[bool] = ..., predicted_utility: _Optional[float] = ..., datapath_theta: _Optional[_Union[DatapathTheta, _Mapping]] = ...) -> None: ...

class DatapathTheta(_message.Message):
    __slots__ = ("datapath", "values")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DATAPATH_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    datapath: str
    values: _containers.ScalarMap[str, int]
    def __init__(self, datapath: _Optional[str] = ..., values: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ExperimentArm(_message.Message):
    __slots__ = ("experiment", "arm", "cc", "params", "fixed_theta", "policy", "destination_prefixes", "until_unix_ms")
    class Params(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PARAMS_UNSPECIFIED: _ClassVar[ExperimentArm.Params]
        KERNEL_DEFAULT: _ClassVar[ExperimentArm.Params]
        FIXED: _ClassVar[ExperimentArm.Params]
        POLICY: _ClassVar[ExperimentArm.Params]
    PARAMS_UNSPECIFIED: ExperimentArm.Params
    KERNEL_DEFAULT: ExperimentArm.Params
    FIXED: ExperimentArm.Params
    POLICY: ExperimentArm.Params
    EXPERIMENT_FIELD_NUMBER: _ClassVar[int]
    ARM_FIELD_NUMBER: _ClassVar[int]
    CC_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    FIXED_THETA_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    UNTIL_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    experiment: str
    arm: str
    cc: str
    params: ExperimentArm.Params
    fixed_theta: DatapathTheta
    policy: str
    destination_prefixes: _containers.RepeatedScalarFieldContainer[str]
    until_unix_ms: int
    def __init__(self, experiment: _Optional[str] = ..., arm: _Optional[str] = ..., cc: _Optional[str] = ..., params: _Optional[_Union[ExperimentArm.Params, str]] = ..., fixed_theta: _Optional[_Union[DatapathTheta, _Mapping]] = ..., policy: _Optional[str] = ..., destination_prefixes: _Optional[_Iterable[str]] = ..., until_unix_ms: _Optional[int] = ...) -> None: ...

class GetParametersResponse(_message.Message):
    __slots__ = ("parameters", "default_theta", "target_cc", "refresh_after_seconds", "experiment_arm", "default_datapath_theta", "completion_sums")
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_THETA_FIELD_NUMBER: _ClassVar[int]
    TARGET_CC_FIELD_NUMBER: _ClassVar[int]
    REFRESH_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENT_ARM_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_DATAPATH_THETA_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_SUMS_FIELD_NUMBER: _ClassVar[int]
    parameters: _containers.RepeatedCompositeFieldContainer[ContextParameters]
    default_theta: Theta
    target_cc: str
    refresh_after_seconds: int
    experiment_arm: ExperimentArm
    default_datapath_theta: DatapathTheta
    completion_sums: bool
    def __init__(self, parameters: _Optional[_Iterable[_Union[ContextParameters, _Mapping]]] = ..., default_theta: _Optional[_Union[Theta, _Mapping]] = ..., target_cc: _Optional[str] = ..., refresh_after_seconds: _Optional[int] = ..., experiment_arm: _Optional[_Union[ExperimentArm, _Mapping]] = ..., default_datapath_theta: _Optional[_Union[DatapathTheta, _Mapping]] = ..., completion_sums: _Optional[bool] = ...) -> None: ...
