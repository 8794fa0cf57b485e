"""Where the tuning model's facts were read: tuning.cc (parseList of NCCL_ALGO/NCCL_PROTO, which algorithm and
protocol each collective may use, the thread counts), enqueue.cc's "no algorithm" failure and init.cc's name
tables. TUNING_CITES maps a rule key to its citation (citation.Cite); ncclsrc.CITES holds these first.
"""
from __future__ import annotations

from .citation import Cite

_c = Cite.at
T = "src/graph/tuning.cc"
TUNING_CITES = {
    "parse_list": _c(T, "ncclResult_t parseList(", v2_18_6=34, v2_21_5=34, v2_23_4=34,
                     v2_24_3=53, v2_27_7=53, v2_30_7=55),
    "list_strtok": _c(T, 'strtok_r(tokStr, ",", &tmpStr)', v2_18_6=44, v2_21_5=44, v2_23_4=44,
                      v2_24_3=89, v2_27_7=93, v2_30_7=99),
    "unknown_element": _c(T, 'WARN("Unrecognized element token', v2_24_3=99, v2_27_7=103,
                          v2_30_7=109),
    "unknown_prefix": _c(T, 'WARN("Unrecognized prefix token', v2_24_3=107, v2_27_7=113,
                         v2_30_7=119),
    "first_prefix": _c(T, 'WARN("All entries except the first must have a prefix', v2_24_3=67,
                       v2_27_7=70, v2_30_7=73),
    "fulltoken_check": _c(T, "if (fullToken != fullStr) {", v2_24_3=63, v2_27_7=66, v2_30_7=69),
    "elemlist_null": _c(T, "if (elemList[0] == '^') {", v2_24_3=75, v2_27_7=79, v2_30_7=82),
    "ll128_default": _c(T, "protoEnable", v2_18_6=246, v2_21_5=270, v2_23_4=289,
                        v2_24_3=352, v2_27_7=389, v2_30_7=446),
    "ll128_platform": _c(T, "if (pEnable == 2 && p == NCCL_PROTO_LL128) {", v2_18_6=282,
                         v2_21_5=305, v2_23_4=324, v2_24_3=420, v2_27_7=457, v2_30_7=518),
    "collnet_fallback": _c(T, "algoEnable[NCCL_ALGO_RING] = algoEnable[NCCL_ALGO_TREE] = 1;",
                           v2_18_6=270, v2_21_5=294, v2_23_4=313),
    "ring_never_disabled": _c(T, "// Never disable ring for non-allreduce operations",
                              v2_18_6=296),
    "ring_restore": _c(T, "/* at least set ring algo available */", v2_21_5=332, v2_23_4=352),
    "ringbdw_zero": _c(T, "if (a == NCCL_ALGO_RING && pEnable == 0) comm->ringbdw[c][p] = 0;",
                       v2_23_4=339),
    "bcast_ring_only": _c(T, "ncclFuncBroadcast", v2_18_6=166, v2_21_5=166, v2_23_4=170,
                          v2_24_3=233, v2_27_7=255, v2_30_7=294),
    "ag_algos": _c(T, "ncclFuncAllGather", v2_18_6=169, v2_21_5=169, v2_23_4=171, v2_24_3=234,
                   v2_27_7=256, v2_30_7=295),
    "ar_no_pat": _c(T, "if (coll == ncclFuncAllReduce && a == NCCL_ALGO_PAT) continue;",
                    v2_23_4=174, v2_24_3=237, v2_27_7=259, v2_30_7=298),
    "nvls_simple": _c(T, "(a == NCCL_ALGO_NVLS || a == NCCL_ALGO_NVLS_TREE) && p != NCCL_PROTO_SIMPLE",
                      v2_18_6=172, v2_21_5=172, v2_23_4=177, v2_24_3=240, v2_27_7=262, v2_30_7=301),
    "collnet_simple": _c(T, "if (a == NCCL_ALGO_COLLNET_DIRECT && p != NCCL_PROTO_SIMPLE) busBw = 0;",
                         v2_18_6=184, v2_21_5=186, v2_23_4=194, v2_24_3=257, v2_27_7=286,
                         v2_30_7=338),
    "pat_simple": _c(T, "a == NCCL_ALGO_PAT", v2_23_4=179, v2_24_3=242, v2_27_7=264, v2_30_7=302),
    "get_nthreads": _c(T, "static int getNthreads(const char* name, int env, int min, int max, int def) {",
                       v2_18_6=15, v2_21_5=15, v2_23_4=15, v2_24_3=15, v2_27_7=15, v2_30_7=17),
    "nthreads_param": _c(T, 'NCCL_PARAM(Nthreads, "NTHREADS", -2);', v2_18_6=12, v2_21_5=12,
                         v2_23_4=12, v2_24_3=12, v2_27_7=12, v2_30_7=14),
    "nthreads_call": _c(T, 'getNthreads("NCCL_NTHREADS", ncclParamNthreads(), 2', v2_18_6=123,
                        v2_21_5=123, v2_23_4=130, v2_24_3=194, v2_27_7=216, v2_30_7=247),
    "ll128_nthreads_call": _c(T, 'getNthreads("NCCL_LL128_NTHREADS", ncclParamLl128Nthreads(), NCCL_LL128_MAX_NTHREADS',
                              v2_18_6=133, v2_21_5=133, v2_23_4=140, v2_24_3=204, v2_27_7=226,
                              v2_30_7=256),
    "no_algorithm": _c("src/enqueue.cc", "o algorithm/protocol available", v2_18_6=1182,
                       v2_21_5=1528, v2_23_4=1848, v2_24_3=1656, v2_27_7=1825, v2_30_7=2063),
    "algo_names": _c("src/init.cc", "const char* ncclAlgoStr[NCCL_NUM_ALGORITHMS] =", v2_18_6=38,
                     v2_21_5=40, v2_23_4=40, v2_24_3=41, v2_27_7=45, v2_30_7=53),
    "func_names": _c("src/init.cc", "const char* ncclFuncStr[NCCL_NUM_FUNCTIONS] =", v2_18_6=37,
                     v2_21_5=39, v2_23_4=39, v2_24_3=40, v2_27_7=44, v2_30_7=52),
    "proto_names": _c("src/init.cc", "const char* ncclProtoStr[NCCL_NUM_PROTOCOLS] =", v2_18_6=39,
                      v2_21_5=41, v2_23_4=41, v2_24_3=42, v2_27_7=46, v2_30_7=55),
}
