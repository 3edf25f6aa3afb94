// SPDX-License-Identifier: GPL-2.0
/*
 * tcp_fusion's copy of the θ table (cc_table.h): the shared sources compiled once for this
 * module, with Fusion's θ (fusion.h).
 */
#include "fusion.h"

static const u32 fusion_theta_default[FUSION_THETA_NPARAMS] = FUSION_THETA_DEFAULT;

/* tcp_fusion has no module parameters: a namespace's default starts at the spec's defaults. */
void cc_table_host_theta(u32 theta[FUSION_THETA_NPARAMS])
{
	memcpy(theta, fusion_theta_default, sizeof(fusion_theta_default));
}

#include "fusion_lpm.c"
#include "fusion_profiles.c"
#include "fusion_netlink.c"
