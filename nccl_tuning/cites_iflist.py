"""Where NCCL_SOCKET_IFNAME and NCCL_IB_HCA were read: parseStringList and matchIfList (utils.cc)
and their readers (socket.cc, net_ib.cc; 2.30.7: os/linux.cc, transport/net_ib/). These rules were
also read at 2.16.5 and 2.17.1 (ncclsrc.IF_TAGS). Keys ending in _30 are the same code moved to
another file in 2.30.7. IF_CITES maps a rule key to its citation (citation.Cite).
"""

from __future__ import annotations

from .citation import Cite

_c = Cite.at
U, SK, IB, LX, IB30 = (
    "src/misc/utils.cc",
    "src/misc/socket.cc",
    "src/transport/net_ib.cc",
    "src/os/linux.cc",
    "src/transport/net_ib/init.cc",
)
_TO_27 = dict(v2_16_5=0, v2_17_1=0, v2_18_6=0, v2_21_5=0, v2_23_4=0, v2_24_3=0, v2_27_7=0)


def _u(quote, old, new, **more):
    """utils.cc lines: old = (2.16.5-2.21.5 line, 2.23.4-2.27.7 line), new = 2.30.7's (or None)."""
    lines = {k: old[0] if k < "v2_23" else old[1] for k in _TO_27}
    if new:
        lines["v2_30_7"] = new
    return _c(U, quote, **lines, **more)


IF_CITES = {
    "if_parse": _u(
        "int parseStringList(const char* string, struct netIf* ifList, int maxList) {",
        (137, 135),
        189,
    ),
    "if_port_scan": _u("ifList[ifNum].port = atoi(ptr+1);", (150, 148), None),
    "if_port_tok": _c(
        U, "ifList[ifNum].port = (tok && tok[0] != '\\0') ? atoi(tok) : -1;", v2_30_7=205
    ),
    "if_name_tok": _c(U, "if (tok && tok[0] != '\\0') {", v2_30_7=201),
    "if_max_scan": _u("} while (ifNum < maxList && c);", (165, 163), None),
    "if_max_tok": _c(U, "while (entry != NULL && ifNum < maxList) {", v2_30_7=198),
    "if_match": _u(
        "int matchLen = matchExact ? strlen(string) + 1 : strlen(ref);", (171, 169), 220
    ),
    "if_port_match": _u("if (port1 == -1) return true;", (176, 174), 225),
    "if_empty_all": _u("if (listSize == 0) return true;", (185, 183), 234),
    "sock_len": _c(
        SK,
        "if (env && strlen(env) > 1) {",
        v2_16_5=329,
        v2_17_1=329,
        v2_18_6=329,
        v2_21_5=330,
        v2_23_4=331,
        v2_24_3=353,
        v2_27_7=360,
        v2_30_7=198,
    ),
    "sock_auto": _c(
        SK,
        'Interfaces("^docker,lo',
        v2_16_5=350,
        v2_17_1=350,
        v2_18_6=350,
        v2_21_5=351,
        v2_23_4=352,
        v2_24_3=374,
        v2_27_7=381,
        v2_30_7=220,
    ),
    "sock_not": _c(
        SK,
        "bool searchNot = prefixList && prefixList[0] == '^';",
        v2_16_5=105,
        v2_17_1=105,
        v2_18_6=105,
        v2_21_5=106,
        v2_23_4=106,
        v2_24_3=128,
        v2_27_7=135,
    ),
    "sock_exact": _c(
        SK,
        "bool searchExact = prefixList && prefixList[0] == '=';",
        v2_16_5=107,
        v2_17_1=107,
        v2_18_6=107,
        v2_21_5=108,
        v2_23_4=108,
        v2_24_3=130,
        v2_27_7=137,
    ),
    "sock_match": _c(
        SK,
        "if (!(matchIfList(interface->ifa_name, -1, userIfs, nUserIfs, searchExact) ^ "
        "searchNot)) {",
        v2_16_5=135,
        v2_17_1=135,
        v2_18_6=135,
        v2_21_5=136,
        v2_23_4=136,
        v2_24_3=158,
        v2_27_7=165,
    ),
    "sock_not_30": _c(LX, "bool searchNot = prefixList && prefixList[0] == '^';", v2_30_7=385),
    "sock_exact_30": _c(LX, "bool searchExact = prefixList && prefixList[0] == '=';", v2_30_7=387),
    "sock_match_30": _c(
        LX,
        "if (!(matchIfList(interface->ifa_name, -1, userIfs, nUserIfs, searchExact) ^ "
        "searchNot)) {",
        v2_30_7=417,
    ),
    "sock_running_30": _c(LX, "if (!(interface->ifa_flags & IFF_RUNNING)) continue;", v2_30_7=402),
    "max_ifs": _c(
        "src/include/socket.h",
        "#define MAX_IFS 16",
        v2_16_5=18,
        v2_17_1=18,
        v2_18_6=18,
        v2_21_5=18,
        v2_23_4=18,
        v2_24_3=18,
        v2_27_7=18,
        v2_30_7=25,
    ),
    "bootstrap_none": _c(
        "src/bootstrap.cc",
        'WARN("Bootstrap : no socket interface found");',
        v2_16_5=45,
        v2_17_1=45,
        v2_18_6=45,
        v2_21_5=48,
        v2_23_4=111,
        v2_24_3=112,
        v2_27_7=115,
        v2_30_7=126,
    ),
    "ib_not": _c(
        IB,
        "bool searchNot = userIbEnv && userIbEnv[0] == '^';",
        v2_16_5=181,
        v2_17_1=181,
        v2_18_6=182,
        v2_21_5=415,
        v2_23_4=526,
        v2_24_3=577,
        v2_27_7=638,
    ),
    "ib_exact": _c(
        IB,
        "bool searchExact = userIbEnv && userIbEnv[0] == '=';",
        v2_16_5=183,
        v2_17_1=183,
        v2_18_6=184,
        v2_21_5=417,
        v2_23_4=528,
        v2_24_3=579,
        v2_27_7=640,
    ),
    "ib_match": _c(
        IB,
        "matchIfList(devices[d]->name, port",
        v2_16_5=214,
        v2_17_1=214,
        v2_18_6=215,
        v2_21_5=448,
        v2_23_4=563,
        v2_24_3=610,
        v2_27_7=687,
    ),
    "ib_ports": _c(
        IB,
        "<= devAttr.phys_port_cnt; port",
        v2_16_5=203,
        v2_17_1=203,
        v2_18_6=204,
        v2_21_5=437,
        v2_23_4=552,
        v2_24_3=599,
        v2_27_7=674,
    ),
    "ib_none": _c(
        IB,
        '"NET/IB : No device found."',
        v2_16_5=251,
        v2_17_1=251,
        v2_18_6=252,
        v2_21_5=511,
        v2_23_4=642,
        v2_24_3=659,
        v2_27_7=749,
    ),
    "ib_max": _c(
        IB,
        "#define MAX_IB_DEVS",
        v2_16_5=69,
        v2_17_1=69,
        v2_18_6=69,
        v2_21_5=74,
        v2_23_4=80,
        v2_24_3=81,
        v2_27_7=101,
    ),
    "ib_not_30": _c(IB30, "bool searchNot = userIbEnv && userIbEnv[0] == '^';", v2_30_7=320),
    "ib_exact_30": _c(IB30, "bool searchExact = userIbEnv && userIbEnv[0] == '=';", v2_30_7=322),
    "ib_match_30": _c(IB30, "matchIfList(devices[d]->name, port", v2_30_7=370),
    "ib_ports_30": _c(IB30, "<= devAttr.phys_port_cnt; port", v2_30_7=357),
    "ib_none_30": _c(IB30, '"NET/IB : No device found."', v2_30_7=470),
    "ib_max_30": _c("src/transport/net_ib/common.h", "#define MAX_IB_DEVS 32", v2_30_7=112),
    "net_disabled": _c(
        "src/net.cc",
        "devices(&ndev) != ncclSuccess || ndev <= 0",
        v2_16_5=246,
        v2_17_1=240,
        v2_18_6=240,
        v2_21_5=528,
        v2_23_4=576,
        v2_24_3=886,
    ),
    "net_disabled_27": _c(
        "src/plugin/net.cc", "devices(&ndev) != ncclSuccess || ndev <= 0", v2_27_7=144, v2_30_7=181
    ),
}
