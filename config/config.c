/* config.c — start-up, in the documented order: the built-in defaults, then one
 * file ($STAGEHAND_CONFIG, or ./stagehand.ini), then STAGEHAND_* from the
 * environment, then the checks (those known before the machine is at load time,
 * the rest when sh_config_resolve() learns the card's and the RAM's sizes).
 *
 * No state: every function works on the caller's struct, environment array and
 * buffers, so all of it is reentrant.
 */
#include "config/config_int.h"

int sh_config_load(struct sh_config *cfg, char *const *envp, char *used_path, size_t pathlen,
                   char *err, size_t errlen)
{
    int rc, secure = sh_config_secure();
    sh_config_defaults(cfg);
    sh_cfg_copy(used_path, pathlen, "");
    if (secure)
        envp = NULL; /* another user wrote it: not one STAGEHAND_* name is read */
    if ((rc = sh_cfg_load_found(cfg, envp, secure, used_path, pathlen, err, errlen)) != 0)
        return rc;
    if ((rc = sh_config_apply_env(cfg, envp, err, errlen)) != 0)
        return rc;
    return sh_cfg_check_static(cfg, err, errlen);
}

int sh_config_init(struct sh_config *cfg, char *const *envp, uint64_t card_bytes,
                   uint64_t host_ram_bytes, char *used_path, size_t pathlen, char *err,
                   size_t errlen)
{
    int rc = sh_config_load(cfg, envp, used_path, pathlen, err, errlen);
    if (rc != 0)
        return rc;
    return sh_config_resolve(cfg, card_bytes, host_ram_bytes, err, errlen);
}
