"""NCCL facts per source tag, each with the file:line it was read from.

The tags are the NCCL releases whose code was read (NVIDIA/nccl at each tag; the commits are in
../shared/reference/nccl/README.md): read, never copied. A version between two tags is checked with the
nearest tag at or below its major.minor (said in the output); below the oldest, with the oldest. Every fact
below names its source line; CITES maps a rule key to {tag: line} in one file and the text that line holds
(a reference for a reader checking it with `git show TAG:PATH`); tests/test_nccl_rules.py pins the facts.
"""
from __future__ import annotations

from dataclasses import dataclass

TAGS = ((2, 18, 6), (2, 21, 5), (2, 23, 4), (2, 24, 3), (2, 27, 7), (2, 30, 7))
OLDEST, NEWEST = TAGS[0], TAGS[-1]


def vstr(v) -> str:
    return ".".join(str(x) for x in v)


def rules_tag(version: tuple, tags: tuple = TAGS) -> tuple[tuple, str | None]:
    """-> (tag whose rules apply, a note saying so when the tag is not the version itself)."""
    below = [t for t in tags if t[:2] <= tuple(version[:2])]
    if not below:
        return tags[0], (f"older than the oldest NCCL release read ({vstr(tags[0])}); checked with "
                         f"{vstr(tags[0])}'s rules")
    tag = below[-1]
    if tuple(version) == tag:
        return tag, None
    if tuple(version) > tags[-1]:
        return tag, f"newer than the newest NCCL release read; checked with {vstr(tag)}'s rules"
    return tag, (f"no rules read from this exact version; checked with {vstr(tag)}, the nearest "
                 f"NCCL release read at or below {version[0]}.{version[1]}")


@dataclass(frozen=True)
class Cite:
    file: str          # path inside nccl-<tag>/
    quote: str         # text the cited line contains
    lines: dict        # tag -> line number


def _c(file, quote, **lines):
    return Cite(file, quote, {tuple(int(x) for x in k[1:].split("_")): v for k, v in lines.items()})


T = "src/graph/tuning.cc"
CITES = {
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
    "int_strtoll": _c("src/misc/param.cc", "value = strtoll(str, nullptr, 0);", v2_18_6=70,
                      v2_21_5=70, v2_23_4=81, v2_24_3=81, v2_27_7=82, v2_30_7=95),
    "int_empty": _c("src/misc/param.cc", "if (str && strlen(str) > 0) {", v2_18_6=68, v2_21_5=68,
                    v2_23_4=79, v2_24_3=79, v2_27_7=80, v2_30_7=93),
    "maxchannels": _c("src/include/device.h", "#define MAXCHANNELS", v2_21_5=54, v2_23_4=62,
                      v2_24_3=62, v2_27_7=87, v2_30_7=91),
    "simple_max_nthreads": _c("src/include/device.h", "#define NCCL_SIMPLE_MAX_NTHREADS 512",
                              v2_21_5=56, v2_23_4=66, v2_24_3=66, v2_27_7=91, v2_30_7=95),
    "ll128_max_nthreads": _c("src/include/device.h", "#define NCCL_LL128_MAX_NTHREADS 640",
                             v2_21_5=74, v2_23_4=85, v2_24_3=85, v2_27_7=110, v2_30_7=114),
    "nccl_steps": _c("src/include/device.h", "#define NCCL_STEPS 8", v2_21_5=22, v2_23_4=24,
                     v2_24_3=24, v2_27_7=25, v2_30_7=26),
    "min_nchannels_clamp": _c("src/graph/connect.cc", "if (minNchannels > MAXCHANNELS) {",
                              v2_18_6=321, v2_21_5=330, v2_23_4=335, v2_24_3=335, v2_27_7=332,
                              v2_30_7=338),
    "min_nchannels_neg": _c("src/graph/connect.cc", "if (minNchannels < 0) minNchannels = 0;",
                            v2_18_6=325, v2_21_5=334, v2_23_4=339, v2_24_3=339, v2_27_7=336,
                            v2_30_7=342),
    "max_nchannels_clamp": _c("src/graph/connect.cc",
                              "if (maxNchannels > MAXCHANNELS) maxNchannels = MAXCHANNELS;",
                              v2_18_6=332, v2_21_5=341, v2_23_4=350, v2_24_3=350, v2_27_7=347,
                              v2_30_7=353),
    "max_nchannels_one": _c("src/graph/connect.cc", "if (maxNchannels < 1) {", v2_18_6=333,
                            v2_21_5=342, v2_23_4=351, v2_24_3=351, v2_27_7=348, v2_30_7=354),
    "per_peer_param": _c("src/graph/paths.cc", 'NCCL_PARAM(NChannelsPerNetPeer, "NCHANNELS_PER_NET_PEER"',
                         v2_18_6=667, v2_21_5=692, v2_23_4=688, v2_24_3=735, v2_27_7=796),
    "per_peer_param_30": _c("src/init.cc", 'NCCL_PARAM(NChannelsPerNetPeer, "NCHANNELS_PER_NET_PEER", NCCL_CONFIG_UNDEF_INT);',
                            v2_30_7=1729),
    "per_peer_auto": _c("src/graph/paths.cc", "if (nNetChannels ==", v2_21_5=715, v2_23_4=711,
                        v2_24_3=758, v2_27_7=819, v2_30_7=944),
    "per_peer_shrink": _c("src/graph/paths.cc", "comm->config.nChannelsPerNetPeer == NCCL_CONFIG_UNDEF_INT",
                          v2_30_7=993),
    "buffsize_param": _c("src/init.cc", 'NCCL_PARAM(BuffSize, "BUFFSIZE", -2);', v2_18_6=504,
                         v2_21_5=545, v2_23_4=602, v2_24_3=599, v2_27_7=621, v2_30_7=814),
    "buffsize_default": _c("src/init.cc", "#define DEFAULT_BUFFSIZE (1 << 22) /* 4MiB */",
                           v2_18_6=502, v2_21_5=544, v2_23_4=601, v2_24_3=598, v2_27_7=620,
                           v2_30_7=813),
    "buffsize_use": _c("src/init.cc", "envs[p] != -2 ? envs[p] : defaults[p];", v2_18_6=522,
                       v2_21_5=561, v2_23_4=618, v2_24_3=612, v2_27_7=634, v2_30_7=827),
    "net_chunk_param": _c("src/init.cc", 'NCCL_PARAM(P2pNetChunkSize, "P2P_NET_CHUNKSIZE", (1 << 17));',
                          v2_18_6=508, v2_21_5=549, v2_23_4=606, v2_24_3=603, v2_27_7=625,
                          v2_30_7=818),
    "chunk_clamp": _c("src/init.cc", "if (comm->p2pChunkSize * NCCL_STEPS > comm->buffSizes[NCCL_PROTO_SIMPLE])",
                      v2_21_5=569, v2_23_4=626, v2_24_3=620, v2_27_7=642, v2_30_7=842),
    "debug_levels": _c("src/debug.cc", 'strcasecmp(nccl_debug, "VERSION")', v2_18_6=32,
                       v2_21_5=33, v2_23_4=37, v2_24_3=38, v2_27_7=51),
    "debug_level_unset": _c("src/debug.cc", "int tempNcclDebugLevel = -1;", v2_18_6=29,
                            v2_21_5=30, v2_23_4=34, v2_24_3=35, v2_27_7=42),
    "debug_subsys_strtok": _c("src/debug.cc", 'char *subsys = strtok(ncclDebugSubsys, ",");',
                              v2_18_6=54, v2_21_5=55, v2_23_4=59, v2_24_3=60, v2_27_7=73),
    "debug_level_param": _c("src/debug.cc", "DEFINE_NCCL_PARAM(ncclParamDebugLevel", v2_30_7=45),
    "debug_subsys_param": _c("src/debug.cc", "DEFINE_NCCL_PARAM(ncclParamDebugSubsys", v2_30_7=55),
    "enum_resolve": _c("src/include/param/parser_enum.h",
                       "std::string token = nccl::param::utils::trim(std::string(input));",
                       v2_30_7=22),
    "bitset_reject": _c("src/include/param/parser_bitset.h", "if (!found) return ncclInvalidArgument;",
                        v2_30_7=51),
    "level_strcmp": _c("src/graph/paths.cc", "if (strcmp(str, topoPathTypeStr[i]) == 0) {",
                       v2_18_6=225, v2_21_5=227, v2_23_4=225, v2_24_3=225, v2_27_7=232,
                       v2_30_7=259),
    "level_legacy": _c("src/graph/paths.cc", "if (l == -1 && str[0] >= '0' && str[0] <= '9') {",
                       v2_18_6=234, v2_21_5=236, v2_23_4=234, v2_24_3=234, v2_27_7=241,
                       v2_30_7=268),
    "level_table": _c("src/graph/paths.cc", "levelsOldToNew[] =", v2_18_6=210, v2_21_5=212,
                      v2_23_4=209, v2_24_3=209, v2_27_7=216, v2_30_7=243),
    "p2p_disable": _c("src/graph/paths.cc", "if (disable == 1) l =", v2_18_6=218, v2_21_5=220,
                      v2_23_4=217, v2_24_3=217, v2_27_7=224, v2_30_7=251),
}


# ---- NCCL_SOCKET_IFNAME / NCCL_IB_HCA (parseStringList, matchIfList and their readers) ----------
# These rules were also read at 2.16.5 and 2.17.1, so they have their own tag list; a version is
# checked with the nearest of IF_TAGS at or below it (if_rules_tag). Keys ending in _30 are the
# same code moved to another file in 2.30.7 (src/os/linux.cc, src/transport/net_ib/).
IF_TAGS = ((2, 16, 5), (2, 17, 1)) + TAGS

U, SK, IB, LX, IB30 = ("src/misc/utils.cc", "src/misc/socket.cc", "src/transport/net_ib.cc",
                       "src/os/linux.cc", "src/transport/net_ib/init.cc")
_TO_27 = dict(v2_16_5=0, v2_17_1=0, v2_18_6=0, v2_21_5=0, v2_23_4=0, v2_24_3=0, v2_27_7=0)


def _u(quote, old, new, **more):
    """utils.cc lines: old = (2.16.5-2.21.5 line, 2.23.4-2.27.7 line), new = 2.30.7's (or None)."""
    lines = {k: old[0] if k < "v2_23" else old[1] for k in _TO_27}
    if new:
        lines["v2_30_7"] = new
    return _c(U, quote, **lines, **more)


IF_CITES = {
    "if_parse": _u("int parseStringList(const char* string, struct netIf* ifList, int maxList) {",
                   (137, 135), 189),
    "if_port_scan": _u("ifList[ifNum].port = atoi(ptr+1);", (150, 148), None),
    "if_port_tok": _c(U, "ifList[ifNum].port = (tok && tok[0] != '\\0') ? atoi(tok) : -1;", v2_30_7=205),
    "if_name_tok": _c(U, "if (tok && tok[0] != '\\0') {", v2_30_7=201),
    "if_max_scan": _u("} while (ifNum < maxList && c);", (165, 163), None),
    "if_max_tok": _c(U, "while (entry != NULL && ifNum < maxList) {", v2_30_7=198),
    "if_match": _u("int matchLen = matchExact ? strlen(string) + 1 : strlen(ref);", (171, 169), 220),
    "if_port_match": _u("if (port1 == -1) return true;", (176, 174), 225),
    "if_empty_all": _u("if (listSize == 0) return true;", (185, 183), 234),
    "sock_len": _c(SK, "if (env && strlen(env) > 1) {", v2_16_5=329, v2_17_1=329, v2_18_6=329,
                   v2_21_5=330, v2_23_4=331, v2_24_3=353, v2_27_7=360, v2_30_7=198),
    "sock_auto": _c(SK, 'Interfaces("^docker,lo', v2_16_5=350, v2_17_1=350, v2_18_6=350,
                    v2_21_5=351, v2_23_4=352, v2_24_3=374, v2_27_7=381, v2_30_7=220),
    "sock_not": _c(SK, "bool searchNot = prefixList && prefixList[0] == '^';", v2_16_5=105,
                   v2_17_1=105, v2_18_6=105, v2_21_5=106, v2_23_4=106, v2_24_3=128, v2_27_7=135),
    "sock_exact": _c(SK, "bool searchExact = prefixList && prefixList[0] == '=';", v2_16_5=107,
                     v2_17_1=107, v2_18_6=107, v2_21_5=108, v2_23_4=108, v2_24_3=130, v2_27_7=137),
    "sock_match": _c(SK, "if (!(matchIfList(interface->ifa_name, -1, userIfs, nUserIfs, searchExact) ^ searchNot)) {",
                     v2_16_5=135, v2_17_1=135, v2_18_6=135, v2_21_5=136, v2_23_4=136, v2_24_3=158,
                     v2_27_7=165),
    "sock_not_30": _c(LX, "bool searchNot = prefixList && prefixList[0] == '^';", v2_30_7=385),
    "sock_exact_30": _c(LX, "bool searchExact = prefixList && prefixList[0] == '=';", v2_30_7=387),
    "sock_match_30": _c(LX, "if (!(matchIfList(interface->ifa_name, -1, userIfs, nUserIfs, searchExact) ^ searchNot)) {",
                        v2_30_7=417),
    "sock_running_30": _c(LX, "if (!(interface->ifa_flags & IFF_RUNNING)) continue;", v2_30_7=402),
    "max_ifs": _c("src/include/socket.h", "#define MAX_IFS 16", v2_16_5=18, v2_17_1=18,
                  v2_18_6=18, v2_21_5=18, v2_23_4=18, v2_24_3=18, v2_27_7=18, v2_30_7=25),
    "bootstrap_none": _c("src/bootstrap.cc", 'WARN("Bootstrap : no socket interface found");',
                         v2_16_5=45, v2_17_1=45, v2_18_6=45, v2_21_5=48, v2_23_4=111,
                         v2_24_3=112, v2_27_7=115, v2_30_7=126),
    "ib_not": _c(IB, "bool searchNot = userIbEnv && userIbEnv[0] == '^';", v2_16_5=181,
                 v2_17_1=181, v2_18_6=182, v2_21_5=415, v2_23_4=526, v2_24_3=577, v2_27_7=638),
    "ib_exact": _c(IB, "bool searchExact = userIbEnv && userIbEnv[0] == '=';", v2_16_5=183,
                   v2_17_1=183, v2_18_6=184, v2_21_5=417, v2_23_4=528, v2_24_3=579, v2_27_7=640),
    "ib_match": _c(IB, "matchIfList(devices[d]->name, port", v2_16_5=214, v2_17_1=214,
                   v2_18_6=215, v2_21_5=448, v2_23_4=563, v2_24_3=610, v2_27_7=687),
    "ib_ports": _c(IB, "<= devAttr.phys_port_cnt; port", v2_16_5=203, v2_17_1=203, v2_18_6=204,
                   v2_21_5=437, v2_23_4=552, v2_24_3=599, v2_27_7=674),
    "ib_none": _c(IB, '"NET/IB : No device found."', v2_16_5=251, v2_17_1=251, v2_18_6=252,
                  v2_21_5=511, v2_23_4=642, v2_24_3=659, v2_27_7=749),
    "ib_max": _c(IB, "#define MAX_IB_DEVS", v2_16_5=69, v2_17_1=69, v2_18_6=69, v2_21_5=74,
                 v2_23_4=80, v2_24_3=81, v2_27_7=101),
    "ib_not_30": _c(IB30, "bool searchNot = userIbEnv && userIbEnv[0] == '^';", v2_30_7=320),
    "ib_exact_30": _c(IB30, "bool searchExact = userIbEnv && userIbEnv[0] == '=';", v2_30_7=322),
    "ib_match_30": _c(IB30, "matchIfList(devices[d]->name, port", v2_30_7=370),
    "ib_ports_30": _c(IB30, "<= devAttr.phys_port_cnt; port", v2_30_7=357),
    "ib_none_30": _c(IB30, '"NET/IB : No device found."', v2_30_7=470),
    "ib_max_30": _c("src/transport/net_ib/common.h", "#define MAX_IB_DEVS 32", v2_30_7=112),
    "net_disabled": _c("src/net.cc", "devices(&ndev) != ncclSuccess || ndev <= 0", v2_16_5=246,
                       v2_17_1=240, v2_18_6=240, v2_21_5=528, v2_23_4=576, v2_24_3=886),
    "net_disabled_27": _c("src/plugin/net.cc", "devices(&ndev) != ncclSuccess || ndev <= 0",
                          v2_27_7=144, v2_30_7=181),
}


def cite(key: str, tag: tuple) -> str:
    """'nccl-2.24.3/src/graph/tuning.cc:99' for the tag, or the nearest older tag that has it."""
    c = CITES[key] if key in CITES else IF_CITES[key]
    have = [t for t in sorted(c.lines) if t <= tag] or sorted(c.lines)
    t = have[-1]
    return f"nccl-{vstr(t)}/{c.file}:{c.lines[t]}"


def has(key: str, tag: tuple) -> bool:
    return tag in CITES[key].lines


# ---- facts per tag (each line names its citation key) -------------------------------------

FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")      # func_names
PROTOS = ("LL", "LL128", "Simple")                                                # proto_names


def algorithms(tag) -> tuple:                                                     # algo_names
    base = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree")
    return base + (("PAT",) if tag >= (2, 23, 4) else ())


def coll_algorithms(coll: str, tag) -> set:
    """Algorithms the tuning model gives a bandwidth for this collective (bcast_ring_only,
    ag_algos, ar_no_pat)."""
    if coll in ("Broadcast", "Reduce"):
        return {"Ring"}
    if coll in ("AllGather", "ReduceScatter"):
        if tag < (2, 21, 5):
            return {"Ring"}
        return {"Ring", "NVLS", "CollNetDirect"} | ({"PAT"} if tag >= (2, 23, 4) else set())
    return {"Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree"}


# algorithms that run only with Simple (nvls_simple, collnet_simple, pat_simple)
SIMPLE_ONLY = {"CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"}
# algorithms available only on some hardware / setups (NVLink SHARP, CollNet plugin, PAT's
# one-GPU-per-node case): a collective left with only these fails elsewhere
CONDITIONAL = {"CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"}

WARP_SIZE = 32
NTHREADS = (64, 512)            # nthreads_call: min 2*WARP_SIZE, max NCCL_SIMPLE_MAX_NTHREADS
LL128_NTHREADS = (160, 640)     # ll128_nthreads_call: NCCL_LL128_MAX_NTHREADS/4 .. 640
NCCL_STEPS = 8                  # nccl_steps
DEFAULT_BUFFSIZE = 1 << 22      # buffsize_default
DEFAULT_NET_CHUNK = 1 << 17     # net_chunk_param


def maxchannels(tag) -> int:
    """maxchannels (2.18.6's devcomm.h was not read: 32 as in 2.21.5)."""
    return 64 if tag >= (2, 27, 7) else 32


def per_peer_default(tag) -> str:
    """per_peer_param: 2 in 2.18.6; -1 = automatic (per_peer_auto) from 2.21.5."""
    return "2" if tag < (2, 21, 5) else "auto"


def debug_levels(tag) -> tuple:
    """debug_levels / debug_level_param: the names NCCL_DEBUG accepts (same five in every tag)."""
    return ("VERSION", "WARN", "INFO", "ABORT", "TRACE")


def debug_subsys(tag) -> tuple:
    """debug_subsys_strtok / debug_subsys_param: NCCL_DEBUG_SUBSYS names per tag."""
    names = ["INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "CALL",
             "PROXY", "NVLS"]
    if tag >= (2, 21, 5):
        names += ["BOOTSTRAP", "REG"]
    if tag >= (2, 23, 4):
        names += ["PROFILE"]
    if tag >= (2, 24, 3):
        names += ["RAS"]
    if tag >= (2, 30, 7):
        names.insert(names.index("CALL"), "ALLOC_HOST")
        names += ["DESTROY"]
    return tuple(names + ["ALL"])


def path_levels(tag) -> tuple:
    """level_strcmp: the names ncclGetLevel compares against (topoPathTypeStr up to PATH_SYS).
    topo.h/topo.cc were not read: the set is the PATH_* levels paths.cc of that tag
    uses below NET, in NCCL's order; C2C and P2C appear from 2.27.7."""
    if tag >= (2, 27, 7):
        return ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "P2C", "PHB", "SYS")
    return ("LOC", "NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS")


LEGACY_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS", "SYS")   # level_table


# ---- NCCL_SOCKET_IFNAME / NCCL_IB_HCA facts per tag (IF_TAGS; each names its IF_CITES key) -------

def if_rules_tag(version: tuple) -> tuple[tuple, str | None]:
    return rules_tag(version, IF_TAGS)


def if_key(base: str, tag) -> str:
    """The citation key for the tag: the _30 key where 2.30.7 moved the code to another file."""
    return base + "_30" if tag >= (2, 30, 7) and base + "_30" in IF_CITES else base


def if_parser(tag) -> str:
    """if_port_scan: a character scanner up to 2.27.7 ('name:' -> port atoi('') = 0);
    if_port_tok: strtok(',') + strsep(':') in 2.30.7 ('name:' -> port -1 = any)."""
    return "tok" if tag >= (2, 30, 7) else "scan"


MAX_IFS = 16                    # max_ifs: NCCL_SOCKET_IFNAME entries read (if_max_scan/if_max_tok)
IF_PREFIX_MAX = 63              # struct netIf prefix[64] (utils.h), with its terminating NUL


def max_ib_devs(tag) -> int:
    """ib_max / ib_max_30: NCCL_IB_HCA entries read; 16 in 2.16.5 and 2.17.1, 32 from 2.18.6."""
    return 16 if tag < (2, 18, 6) else 32


def if_auto(tag) -> tuple:
    """sock_auto: the order NCCL tries when NCCL_SOCKET_IFNAME is unset or one character long
    (sock_len); 2.30.7 also avoids virbr* until last."""
    if tag >= (2, 30, 7):
        return ("ib", "NCCL_COMM_ID's subnet", "^docker,lo,virbr", "docker", "lo", "virbr")
    return ("ib", "NCCL_COMM_ID's subnet", "^docker,lo", "docker", "lo")


def skips_not_running(tag) -> bool:
    """sock_running_30: from 2.30.7 interfaces that are not RUNNING are never selected."""
    return tag >= (2, 30, 7)
