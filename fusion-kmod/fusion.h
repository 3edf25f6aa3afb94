/* SPDX-License-Identifier: GPL-2.0 */
/*
 * tcp_fusion's parts: the congestion control (fusion_cc.c) and its copy of the θ table
 * (cc_table.h; compiled in fusion_table.c) with Fusion's θ, family "fusion" and the
 * net.fusion.* sysctls.
 */
#ifndef _FUSION_H
#define _FUSION_H

#include "fusion_theta.h"
#include "fusion_uapi.h"

#define CC_TABLE_NPARAMS		FUSION_THETA_NPARAMS
#define CC_TABLE_THETA_MIN		FUSION_THETA_MIN
#define CC_TABLE_THETA_MAX		FUSION_THETA_MAX
#define CC_TABLE_THETA_NAMES		FUSION_THETA_NAMES
#define CC_TABLE_THETA_RANGE_ERRORS	FUSION_THETA_RANGE_ERRORS
#define CC_TABLE_GENL_NAME		FUSION_GENL_NAME
#define CC_TABLE_SYSCTL_DIR		"net/fusion"

#include "cc_table.h"

#endif /* _FUSION_H */
