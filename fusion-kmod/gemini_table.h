/* SPDX-License-Identifier: GPL-2.0 */
/*
 * tcp_gemini's copy of the θ table (cc_table.h; compiled in gemini_table.c): GEMINI's θ, generic
 * netlink family "gemini" (Fusion's ABI, fusion_uapi.h), the net.gemini.* sysctls, and a record
 * per finished flow with the θ it ran (cc_flow.c).
 */
#ifndef _GEMINI_TABLE_H
#define _GEMINI_TABLE_H

#include "gemini_theta.h"

#define GEMINI_GENL_NAME			"gemini"

#define CC_TABLE_NPARAMS		GEMINI_THETA_NPARAMS
#define CC_TABLE_THETA_MIN		GEMINI_THETA_MIN
#define CC_TABLE_THETA_MAX		GEMINI_THETA_MAX
#define CC_TABLE_THETA_NAMES		GEMINI_THETA_NAMES
#define CC_TABLE_THETA_RANGE_ERRORS	GEMINI_THETA_RANGE_ERRORS
#define CC_TABLE_GENL_NAME		GEMINI_GENL_NAME
#define CC_TABLE_SYSCTL_DIR		"net/gemini"

#include "cc_table.h"

#endif /* _GEMINI_TABLE_H */
