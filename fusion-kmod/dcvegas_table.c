// SPDX-License-Identifier: GPL-2.0
/*
 * tcp_dcvegas's copy of the θ table and flow records (cc_table.h, cc_flow.c): the shared sources
 * compiled once for this module, with DCVEGAS's θ (dcvegas_table.h). cc_table_host_theta() is in
 * dcvegas_cc.c, beside the module parameters it reads.
 */
#include "dcvegas_table.h"

#include "fusion_lpm.c"
#include "fusion_profiles.c"
#include "fusion_netlink.c"
#include "cc_flow.c"
