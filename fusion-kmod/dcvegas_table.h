/* SPDX-License-Identifier: GPL-2.0 */
/*
 * tcp_dcvegas's copy of the θ table (cc_table.h; compiled in dcvegas_table.c): DCVEGAS's θ, generic
 * netlink family "dcvegas" (Fusion's ABI, fusion_uapi.h), the net.dcvegas.* sysctls, and a record
 * per finished flow with the θ it ran (cc_flow.c).
 */
#ifndef _DCVEGAS_TABLE_H
#define _DCVEGAS_TABLE_H

#include "dcvegas_theta.h"

#define DCVEGAS_GENL_NAME			"dcvegas"

#define CC_TABLE_NPARAMS		DCVEGAS_THETA_NPARAMS
#define CC_TABLE_THETA_MIN		DCVEGAS_THETA_MIN
#define CC_TABLE_THETA_MAX		DCVEGAS_THETA_MAX
#define CC_TABLE_THETA_NAMES		DCVEGAS_THETA_NAMES
#define CC_TABLE_THETA_RANGE_ERRORS	DCVEGAS_THETA_RANGE_ERRORS
#define CC_TABLE_GENL_NAME		DCVEGAS_GENL_NAME
#define CC_TABLE_SYSCTL_DIR		"net/dcvegas"

#include "cc_table.h"

#endif /* _DCVEGAS_TABLE_H */
